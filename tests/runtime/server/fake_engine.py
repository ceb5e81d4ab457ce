"""A small deterministic stand-in for the runtime Engine (same API as docs/engine_api.md) for
fast in-process tests of the server's protocol logic. Tokens are characters; the "model"
answers with the prompt reversed, one character per step."""
from __future__ import annotations

import asyncio
import json
import re
from typing import Any, AsyncIterator

from sgdsl.runtime.errors import ContextLengthError
from sgdsl.runtime.sampling_params import SamplingParams
from sgdsl.runtime.tokenizer.stop import StopStringTrimmer

CONTEXT = 512
EOS = 3
ASSISTANT = "<|im_start|>assistant\n"
EMPTY_THINK = "<think>\n\n</think>\n\n"


class CharTokenizer:
    bos_token = None
    eos_token = "\x03"

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(ch) % 256 for ch in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)


class FakeEngine:
    def __init__(self, step_s: float = 0.002, script: str | None = None,
                 context: int = CONTEXT) -> None:
        self.script = script
        self.context = context
        self.tokenizer = CharTokenizer()
        self.model_info = {"model_path": "/fake/FakeModel", "served_model_name": "fake-model",
                           "context_length": context, "vocab_size": 256, "eos_token_ids": [EOS],
                           "chat_template": None, "is_generation": True}
        self.step_s = step_s
        self.running: set[str] = set()
        self.aborted: set[str] = set()
        self.finished: list[str] = []
        self.finish_types: dict[str, str] = {}

    def server_info(self) -> dict[str, Any]:
        return {"model": "fake", **self.stats()}

    def stats(self) -> dict[str, Any]:
        return {"num_running_reqs": len(self.running), "num_waiting_reqs": 0,
                "kv_total_slots": 100, "kv_free_slots": 100 - len(self.running),
                "kv_evictable_slots": 0, "cache_hit_rate": 0.0, "requests_total":
                len(self.finished)}

    def abort(self, rid: str) -> None:
        if rid in self.running:
            self.aborted.add(rid)

    def flush_cache(self) -> bool:
        return not self.running

    def check_idle_integrity(self) -> None:
        assert not self.running, f"requests still running: {sorted(self.running)}"

    def shutdown(self) -> None:
        pass

    async def async_generate(self, prompt: str | None = None, sampling_params: Any = None,
                             input_ids: list[int] | None = None, return_logprob: bool = False,
                             logprob_start_len: int = -1, top_logprobs_num: int = 0,
                             return_text_in_logprobs: bool = False, stream: bool = False,
                             rid: str | None = None) -> Any:
        many = prompt if isinstance(prompt, list) else input_ids
        if many and not isinstance(many[0], int):  # a list call: one request per prompt
            sps = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(many)
            key = "prompt" if isinstance(prompt, list) else "input_ids"
            return list(await asyncio.gather(*(self.async_generate(
                **{key: p}, sampling_params=sp, rid=r, return_logprob=return_logprob,
                top_logprobs_num=top_logprobs_num) for p, sp, r in zip(many, sps, rid))))
        params = SamplingParams.from_dict(sampling_params)
        ids = input_ids if input_ids is not None else self.tokenizer.encode(prompt or "")
        if len(ids) + params.max_new_tokens > self.context:
            raise ContextLengthError("prompt too long", field="max_new_tokens")
        gen = self._run(list(ids), params, rid or "r", return_logprob, top_logprobs_num, stream)
        if stream:
            return gen
        last = None
        async for last in gen:
            pass
        return {k: v for k, v in last.items() if k != "delta"}

    async def _run(self, ids: list[int], params: SamplingParams, rid: str, logprob: bool,
                   top_n: int, stream: bool) -> AsyncIterator[dict[str, Any]]:
        """Chunks as the engine streams them: cumulative text and ids, and (streams) only
        the output logprob entries no earlier chunk carried."""
        self.running.add(rid)
        out: list[int] = []
        source = self._constrained(self._source(ids), params)
        trimmer = StopStringTrimmer(params.stop, params.no_stop_trim)
        finish: dict[str, Any] | None = None
        prev, sent = "", 0
        try:
            while finish is None:
                if rid in self.aborted:
                    finish = {"type": "abort", "message": "aborted"}
                    break
                if len(out) >= params.max_new_tokens:
                    finish = {"type": "length", "length": len(out)}
                    break
                if self.script is not None and len(out) >= len(source):
                    finish = {"type": "stop", "matched": EOS}
                    break
                await asyncio.sleep(self.step_s)
                out.append(source[len(out) % len(source)])
                text = self.tokenizer.decode(out)
                for s in params.stop:
                    if s in text:
                        finish = {"type": "stop", "matched": s}
                # NOTE: streamed text holds back a possible stop string, as the runtime's does.
                trimmer.push(text[len(trimmer._buf):])
                text = trimmer.text if finish is not None else trimmer.emitted
                yield self._chunk(rid, ids, out, text, prev, finish, logprob, top_n, sent)
                prev, sent = text, (len(out) if stream else 0)
            if finish["type"] != "stop" or finish["matched"] == EOS:
                yield self._chunk(rid, ids, out, prev, prev, finish, logprob, top_n, sent)
            self.finish_types[rid] = finish["type"]
        finally:
            # NOTE: a stream closed by its consumer ends here without a finish reason.
            self.finish_types.setdefault(rid, "closed")
            self.running.discard(rid)
            self.aborted.discard(rid)
            self.finished.append(rid)

    def _source(self, ids: list[int]) -> list[int]:
        """What the "model" writes: the prompt reversed (cycled), or with a ``script`` the
        rest of the scripted assistant answer after what the prompt's assistant turn holds."""
        if self.script is None:
            return list(reversed(ids)) or [ord("x")]
        turn = self.tokenizer.decode(ids).rsplit(ASSISTANT, 1)[-1]
        if turn.startswith(EMPTY_THINK) and not self.script.startswith(EMPTY_THINK):
            turn = turn[len(EMPTY_THINK):]  # the server closed a section the script skips
        assert self.script.startswith(turn), (turn, self.script)
        return self.tokenizer.encode(self.script[len(turn):])

    def _constrained(self, source: list[int], params: SamplingParams) -> list[int]:
        """A scripted answer under a grammar ends where the grammar would end it: after the
        first JSON value (json_schema) or the longest prefix the regex matches."""
        if self.script is None:
            return source
        text = self.tokenizer.decode(source)
        if params.json_schema is not None:
            end = json.JSONDecoder().raw_decode(text)[1]
            return source[:end]
        if params.regex is not None:
            ends = [n for n in range(min(len(text), 64), -1, -1)
                    if re.fullmatch(params.regex, text[:n])]
            return source[:ends[0]]
        return source

    def _chunk(self, rid: str, ids: list[int], out: list[int], text: str, prev: str,
               finish: dict[str, Any] | None, logprob: bool, top_n: int,
               since: int) -> dict[str, Any]:
        meta: dict[str, Any] = {"id": rid, "finish_reason": finish, "prompt_tokens": len(ids),
                                "completion_tokens": len(out), "cached_tokens": 0}
        if logprob:
            meta["output_token_logprobs"] = [[-1.0, t, chr(t)] for t in out[since:]]
            meta["output_token_logprobs_length"] = len(out)
            meta["output_top_logprobs"] = [[[-1.0, t, chr(t)]][:top_n] for t in out[since:]]
            meta["input_token_logprobs"] = [[None if i == 0 else -2.0, t, chr(t)]
                                            for i, t in enumerate(ids)]
            meta["input_top_logprobs"] = [None for _ in ids]
        return {"text": text, "output_ids": list(out), "meta_info": meta,
                "delta": text[len(prev):]}
