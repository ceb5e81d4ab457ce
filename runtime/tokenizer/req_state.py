"""Per-request state in the main process: accumulates what the scheduler streams back and turns
it into the API's output dicts (text, output_ids, meta_info with logprobs).

Text is produced off the scheduler's loop: once at the end for plain requests, incrementally
for streams (IncrementalDetokenizer: no partial UTF-8 character; StopStringTrimmer: no part of
a possible stop string until it is ruled out).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from ..ipc.messages import ReqOut
from ..sampling_params import SamplingParams
from .detokenizer import IncrementalDetokenizer, ids_decoder
from .stop import StopStringTrimmer, trim_at_stop


@dataclass
class ReqState:
    rid: str
    params: SamplingParams
    tokenizer: Any
    return_logprob: bool = False
    return_text_in_logprobs: bool = False
    stream: bool = False
    output_ids: list[int] = field(default_factory=list)
    finish_reason: dict | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    cached_tokens_details: dict | None = None  # hicache: per tier (device, host, storage)
    input_token_logprobs: list = field(default_factory=list)
    input_top_logprobs: list = field(default_factory=list)
    output_token_logprobs: list = field(default_factory=list)
    output_top_logprobs: list = field(default_factory=list)
    forced_positions: list[int] | None = None  # grammar requests: unsampled output positions
    spec_verify_ct: int | None = None  # spec: verify steps (speculative engines only)
    spec_accepted_tokens: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)
    updated: asyncio.Event = field(default_factory=asyncio.Event)
    error: BaseException | None = None
    _detok: Any = None  # streams only: IncrementalDetokenizer + StopStringTrimmer
    _trimmer: Any = None
    _fed: int = 0
    _sent_logprobs: int = 0  # streams: output logprob entries already delivered in a chunk
    validator: Any = None  # grammar.schema.OutputValidator: checks finished json_schema outputs
    _final: str | None = None
    created: float = field(default_factory=time.perf_counter)
    e2e_latency: float | None = None  # seconds from arrival to the finish (SGLang's meta field)
    on_done: Any = None  # called with this state once finished or failed (submitter.py)
    kept: dict | None = None  # the answer, built when it finished (a list call's, manager.py)
    # hops: (sched, recv) of the oldest step not yet in a chunk; steps since the last chunk
    # and the times a step's text was held back (no chunk)
    hops: tuple[float, float] | None = None
    hop_steps: int = 0
    hop_held: int = 0

    def apply(self, out: ReqOut) -> None:
        self.output_ids.extend(out.new_ids)
        self.prompt_tokens, self.cached_tokens = out.prompt_tokens, out.cached_tokens
        if out.spec_verify_ct is not None:  # spec
            self.spec_verify_ct, self.spec_accepted_tokens = (out.spec_verify_ct,
                                                              out.spec_accepted_tokens)
        if out.cached_tokens_details is not None:  # hicache
            self.cached_tokens_details = out.cached_tokens_details
        if out.input_token_logprobs is not None:
            self.input_token_logprobs = out.input_token_logprobs
            self.input_top_logprobs = out.input_top_logprobs or []
        if out.forced_positions:
            self.forced_positions = (self.forced_positions or []) + out.forced_positions
        if out.output_token_logprobs:
            self.output_token_logprobs.extend(out.output_token_logprobs)
            self.output_top_logprobs.extend(out.output_top_logprobs or [])
        if out.finish_reason is not None:
            self.finish_reason = out.finish_reason
            self.e2e_latency = time.perf_counter() - self.created
            if out.finish_reason.get("status") == 400:  # grammar: failed to compile at admission
                from ..errors import InvalidRequestError

                self.error = InvalidRequestError(out.finish_reason["message"],
                                                 field=out.finish_reason.get("field"))
            elif out.finish_reason.get("status") == 503:  # grammar: compile queue too long
                from ..errors import GrammarQueueFullError, KVTransferError

                cls = (KVTransferError if out.finish_reason.get("kind") == KVTransferError.kind
                       else GrammarQueueFullError)  # pd: the KV transfer failed
                self.error = cls(out.finish_reason["message"],
                                 out.finish_reason.get("retry_after", 1.0))
            elif self.validator is not None and self.params.json_schema is not None:
                self._check_output()
            self._set_done()
        self.updated.set()

    def _set_done(self) -> None:
        self.done.set()
        if self.on_done is not None:
            self.on_done(self)

    def _check_output(self) -> None:
        """The backstop: a json_schema output the grammar ended (stop token) must validate
        against the request's original schema; a violation fails the request with the reason.
        Outputs cut by max_new_tokens or a user stop string stay what they are (length/stop)."""
        fr = self.finish_reason or {}
        if fr.get("type") != "stop" or isinstance(fr.get("matched"), str):
            return
        from ..grammar.base import GrammarKey

        key = GrammarKey.from_constraint("json_schema", self.params.json_schema)
        why = self.validator.violation(key.text, self.final_text())
        if why is not None:
            from ..errors import ConstraintViolationError

            self.error = ConstraintViolationError(f"request {self.rid}: {why}")

    def fail(self, error: BaseException) -> None:
        self.error = error
        self._set_done()
        self.updated.set()

    # -- text ---------------------------------------------------------------------------------------
    def _decode(self, ids: list[int]) -> str:
        # NOTE: the backend's decode where that is HF's (ids_decoder): HF's wrapper checked
        # every id in Python (to_py_obj), half of an answer's decode (issue 29: a burst's last
        # finishers are answered one after another while the device waits for the next burst)
        p = self.params
        return ids_decoder(self.tokenizer, p.skip_special_tokens,
                           p.spaces_between_special_tokens)(ids)

    def final_text(self) -> str:
        """All output text, with a matched stop (string or token) trimmed unless no_stop_trim."""
        if self._final is not None:
            return self._final
        ids = self.output_ids
        matched = (self.finish_reason or {}).get("matched")
        trim = not self.params.no_stop_trim
        if trim and isinstance(matched, int) and ids and ids[-1] == matched:
            ids = ids[:-1]
        text = self._decode(ids)
        if isinstance(matched, str):
            text = trim_at_stop(text, matched, not trim, self.params.stop_regex)
        if self.finish_reason is not None:
            self._final = text  # finished: the ids no longer change
        return text

    # -- output dicts ---------------------------------------------------------------------------------
    def result(self) -> dict:
        """The finished request's dict; a failed one (``error``) reports its error in
        ``finish_reason`` (SGLang's abort shape) beside whatever it produced."""
        out = self.to_dict(self.final_text())
        if self.error is not None:
            err = self.error
            out["meta_info"]["finish_reason"] = {
                "type": "abort", "message": getattr(err, "message", None) or str(err),
                "status_code": getattr(err, "status", 500),
                "err_type": getattr(err, "kind", type(err).__name__)}
            if getattr(err, "retry_after", None) is not None:  # overloaded: when to retry
                out["meta_info"]["finish_reason"]["retry_after"] = err.retry_after
        return out

    def to_dict(self, text: str, logprobs_from: int = 0) -> dict:
        """The output dict; ``logprobs_from`` > 0 (streams) leaves out the output logprob
        entries an earlier chunk carried, as SGLang's streamed meta_info does."""
        meta: dict[str, Any] = {
            "id": self.rid, "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens, "completion_tokens": len(self.output_ids),
            "cached_tokens": self.cached_tokens}
        if self.cached_tokens_details is not None:  # hicache
            meta["cached_tokens_details"] = self.cached_tokens_details
        if self.e2e_latency is not None:
            meta["e2e_latency"] = self.e2e_latency
        if self.spec_verify_ct is not None:  # spec: tokens per step = completion / verify_ct
            meta["spec_verify_ct"] = self.spec_verify_ct
            meta["spec_accepted_tokens"] = self.spec_accepted_tokens
        if self.params.constraint is not None:  # grammar: which tokens were not sampled
            meta["forced_token_positions"] = [p for p in self.forced_positions or ()
                                              if p < len(self.output_ids)]
        if self.return_logprob:
            meta["input_token_logprobs"] = [self._entry(e) for e in self.input_token_logprobs]
            meta["output_token_logprobs"] = [self._entry(e) for e in
                                             self.output_token_logprobs[logprobs_from:]]
            # NOTE: the count of entries so far, so a client can place a chunk's entries (SGLang);
            # with jump-forward a forced token's entry may come a chunk after its id.
            meta["output_token_logprobs_length"] = len(self.output_token_logprobs)
            meta["input_top_logprobs"] = [self._tops(t) for t in self.input_top_logprobs]
            meta["output_top_logprobs"] = [self._tops(t) or [] for t in
                                           self.output_top_logprobs[logprobs_from:]]
        return {"text": text, "output_ids": list(self.output_ids), "meta_info": meta}

    def _entry(self, entry: tuple) -> list:
        logprob, token = entry
        text = self.tokenizer.decode([token]) if self.return_text_in_logprobs else None
        return [logprob, token, text]

    def _tops(self, tops: list | None) -> list | None:
        if tops is None:
            return None
        return [self._entry(e) for e in tops]

    def stream_chunk(self) -> dict | None:
        """The dict so far plus ``delta``: new text that is complete UTF-8 and holds no part
        of a (possible) stop string; None while there is no new text and no finish. ``text``
        and ``output_ids`` are cumulative, the output logprobs are those not yet delivered
        (SGLang's streamed meta_info). The last chunk's text equals ``final_text()``."""
        if self._detok is None:
            p = self.params
            self._detok = IncrementalDetokenizer(self.tokenizer, p.skip_special_tokens,
                                                 p.spaces_between_special_tokens)
            self._trimmer = StopStringTrimmer(p.stop, p.no_stop_trim, p.stop_regex)
        ids = self.output_ids[self._fed:]
        matched = (self.finish_reason or {}).get("matched")
        if (isinstance(matched, int) and not self.params.no_stop_trim and ids
                and ids[-1] == matched):
            ids = ids[:-1]  # a matched stop token's text is trimmed
        self._fed = len(self.output_ids)
        delta = self._trimmer.push(self._detok.add(ids))
        if self.finish_reason is not None:
            tail = self._detok.flush()
            delta += self._trimmer.finish(matched if isinstance(matched, str) else None, tail)
            text = self.final_text()
        else:
            text = self._trimmer.emitted
            if not delta:  # nothing to deliver: its logprobs go with the next chunk
                self.hop_held += self.hops is not None  # hops:
                return None
        chunk = self.to_dict(text, self._sent_logprobs)
        self._sent_logprobs = len(self.output_token_logprobs)
        chunk["delta"] = delta
        if self.hops is not None:  # hops: + when this chunk was built ($SGDSL_HOP_TIMES)
            chunk["meta_info"]["hop_times"] = [*self.hops, time.time()]
            chunk["meta_info"]["hop_steps"] = [self.hop_steps, self.hop_held]
            self.hops, self.hop_steps, self.hop_held = None, 0, 0
        return chunk
