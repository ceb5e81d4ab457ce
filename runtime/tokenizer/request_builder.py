"""Turning ``generate`` arguments into validated, tokenized requests, in the caller's thread and
before anything is sent to the scheduler: bad input raises InvalidRequestError naming the field
(ContextLengthError / RequestTooLargeError for size limits) and no KV is ever allocated for it.
"""
from __future__ import annotations

import dataclasses
import json
import uuid
from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import ContextLengthError, InvalidRequestError, RequestTooLargeError
from ..disaggregation.bootstrap import next_bootstrap  # pd:
from ..ipc.messages import Ready, TokenizedGenerateReq
from ..params_key import params_key
from ..sampling_params import SamplingParams
from ..multimodal import request as mm_request
from .checked_memo import CheckedMemo
from .encoder import ids_batch_encoder, ids_encoder

CHECKED_MEMO_SIZE = 1024  # distinct (constraint, budget) pairs whose checks are remembered
_INT = {int}  # the types of a list of plain token ids (a bool, an int subclass, is refused)
PARAMS_MEMO_SIZE = 1024  # distinct sampling dicts whose built params are kept (then all dropped)


@dataclass(frozen=True)
class GenerateSpec:
    """One prompt's request(s): ``reqs`` has n entries (n > 1 fans out, sharing the prefix)."""

    rid: str
    reqs: tuple[TokenizedGenerateReq, ...]
    return_text_in_logprobs: bool


def _per_item(value: Any, n: int, name: str, scalar_types: tuple) -> list:
    if isinstance(value, list) and not isinstance(value, scalar_types):
        if len(value) != n:
            raise InvalidRequestError(f"{name} has {len(value)} entries for {n} prompts", field=name)
        return value
    return [value] * n


class RequestBuilder:
    def __init__(self, tokenizer: Any, ready: Ready, mm: Any = None) -> None:
        self.tokenizer = tokenizer
        self.mm = mm  # mm: the model's MultimodalProcessor (None: text-only)
        self._encode = ids_encoder(tokenizer)
        self._encode_batch = ids_batch_encoder(tokenizer)
        self._token_bytes: int | None = None  # grammar: the longest token, in bytes
        # grammar: (kind, text, budget) -> (json_schema to send, the limits error or None);
        # locked: filled from callers' threads and the check pool's (checked_memo.py)
        self._checked = CheckedMemo(CHECKED_MEMO_SIZE)
        # params_key(dict) -> its checked params. NOTE: no lock: each use is one dict get, set
        # or clear (atomic under the GIL), and a race costs at most one rebuild
        self._built: dict[tuple, SamplingParams] = {}
        self.ready = ready

    def build(self, prompt: Any, sampling_params: Any, input_ids: Any, return_logprob: Any,
              logprob_start_len: Any, top_logprobs_num: Any, return_text_in_logprobs: bool,
              rid: Any, image_data: Any = None) -> tuple[list[GenerateSpec], bool]:
        """Validated specs, plus whether the call was a batch (list in, list out)."""
        if (prompt is None) == (input_ids is None):
            raise InvalidRequestError("give exactly one of prompt or input_ids", field="prompt")
        if prompt is not None:
            batched = isinstance(prompt, list)
            items = prompt if batched else [prompt]
        else:
            batched = bool(input_ids) and isinstance(input_ids[0], list)
            items = input_ids if batched else [input_ids]
        if not items:
            raise InvalidRequestError("the batch of prompts is empty", field="prompt")
        n = len(items)
        params = _per_item(sampling_params, n, "sampling_params", ())
        lps = _per_item(return_logprob, n, "return_logprob", ())
        starts = _per_item(logprob_start_len, n, "logprob_start_len", ())
        tops = _per_item(top_logprobs_num, n, "top_logprobs_num", ())
        rids = _per_item(rid, n, "rid", ())
        images = mm_request.per_prompt(image_data, n, batched)  # mm:
        with_mm = mm_request.process_all(self.mm, items, images, prompt is not None,
                                         self._tokenize if prompt is not None else self._check_ids)
        encoded = self._tokenize_all(items, images) if prompt is not None else None
        specs = []
        for i, item in enumerate(items):
            mm = None
            if images[i]:  # mm: image tokens expanded, MmData built
                ids, mm = with_mm[i]
                mm_request.check_logprob_start(mm, starts[i] if lps[i] else -1)
            elif encoded is not None:
                ids = encoded[i] or self._empty()
            else:
                ids = self._tokenize(item) if prompt is not None else self._check_ids(item)
            sp = self._params(params[i])
            specs.append(self._spec(ids, sp, bool(lps[i]), starts[i], tops[i],
                                    return_text_in_logprobs, rids[i], mm))
        return specs, batched

    def _tokenize(self, text: Any) -> list[int]:
        if not isinstance(text, str):
            raise InvalidRequestError(f"prompt must be a string, got {type(text).__name__}",
                                      field="prompt")
        if not text:
            raise InvalidRequestError("prompt must not be empty", field="prompt")
        return self._encode(text) or self._empty()

    def _tokenize_all(self, texts: list[Any], images: list[Any]) -> list[list[int]] | None:
        """A batch's text prompts (no images) in one tokenizer call: the Rust tokenizer runs
        them in parallel without the GIL (256 chat prompts: one call instead of 256 on the
        caller's loop, ahead of the whole batch's hand-off). None: some prompt is not plain."""
        if len(texts) < 2 or any(images) or not all(isinstance(t, str) and t for t in texts):
            return None  # checked (and refused) one by one, with the exact error
        return self._encode_batch(texts)

    def _empty(self) -> list[int]:
        raise InvalidRequestError("prompt tokenizes to zero tokens", field="prompt")

    def _check_ids(self, ids: Any) -> list[int]:
        if not isinstance(ids, (list, tuple)) or not ids:
            raise InvalidRequestError("input_ids must be a non-empty list of token ids",
                                      field="input_ids")
        vocab = self.ready.vocab_size
        # NOTE: C-level checks first (types, then bounds): ~2.5x faster than the loop below,
        # which a 256-prompt batch of ~300-token ids paid per token; the loop names the culprit
        if not (set(map(type, ids)) == _INT and min(ids) >= 0 and max(ids) < vocab):
            for t in ids:
                if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab:
                    raise InvalidRequestError(f"input_ids entries must be token ids in [0, "
                                              f"{vocab}), got {t!r}", field="input_ids")
        return list(ids)

    def _params(self, value: Any) -> SamplingParams:
        # NOTE: one build per distinct dict: a burst's requests share their params, and then
        # one (frozen) object, which a hand-off's message also pickles once (issue 29)
        key = params_key(value) if isinstance(value, dict) else None
        built = self._built.get(key) if key is not None else None
        if built is not None:
            return built
        sp = value if isinstance(value, SamplingParams) else SamplingParams.from_dict(value)
        sp.validate(self.ready.vocab_size)
        if sp.constraint is not None:  # grammar: cheap checks now; compile errors come back
            sp = self._checked_constraint(sp)  # from the scheduler as the same 400 error
        if key is not None:
            if len(self._built) >= PARAMS_MEMO_SIZE:
                self._built.clear()
            self._built[key] = sp
        return sp

    def unchecked(self, sampling_params: Any) -> list[tuple[tuple, SamplingParams]]:
        """grammar: (memo key, params) of each JSON schema among ``sampling_params`` (a dict,
        a ``SamplingParams`` or a list of them) whose check is not remembered: a caller on an
        event loop runs those checks off it (``check``, check_pool.py) before building. Params
        that fail their own validation are left to ``build``, which raises their error."""
        todo = []
        for value in sampling_params if isinstance(sampling_params, list) else [sampling_params]:
            if isinstance(value, dict):
                if value.get("json_schema") is None:  # the hot path: no schema, nothing to do
                    continue
                key = params_key(value)
                if key is not None and key in self._built:
                    continue
            elif not isinstance(value, SamplingParams) or value.json_schema is None:
                continue
            try:
                sp = value if isinstance(value, SamplingParams) else SamplingParams.from_dict(value)
                sp.validate(self.ready.vocab_size)
            except InvalidRequestError:
                continue
            memo = self._memo_key(sp)
            if memo is not None and memo[0] == "json_schema" and not self._checked.known(memo):
                todo.append((memo, sp))
        return todo

    def check(self, memo: tuple, sp: SamplingParams) -> None:
        """grammar: compute and remember ``sp``'s constraint check (``unchecked``'s pair), from
        any thread; ``build`` then finds it remembered (errors included)."""
        self._checked.get(memo, lambda: self._check_constraint(sp, memo[0], memo[1]))

    @staticmethod
    def _memo_key(sp: SamplingParams) -> tuple | None:
        kind, value = sp.constraint
        if not isinstance(value, str) and kind != "json_schema":
            return None  # a wrong type: GrammarKey names it (not worth remembering)
        text = value if isinstance(value, str) else json.dumps(value)
        return (kind, text, sp.max_new_tokens if kind == "json_schema" else 0)

    def _checked_constraint(self, sp: SamplingParams) -> SamplingParams:
        """grammar: the limits check (with the schema's vacuous bounds dropped), memoized.

        NOTE: the check validates a schema against the JSON Schema meta-schema (~20 ms in
        jsonschema); a batch of 256 requests sharing one schema paid it 256 times, in the
        caller's thread, before anything reached the scheduler. The outcome depends only on
        the constraint and the output budget (vacuous bounds), so it is computed once."""
        kind, value = sp.constraint
        memo = self._memo_key(sp)
        if memo is None:
            hit = self._check_constraint(sp, kind, None)
        else:
            hit = self._checked.get(memo, lambda: self._check_constraint(sp, kind, memo[1]))
        new_text, error = hit
        if error is not None:
            raise type(error)(error.message, field=error.field)
        if kind == "json_schema" and new_text != value:
            return dataclasses.replace(sp, json_schema=new_text)
        return sp

    def _check_constraint(self, sp: SamplingParams, kind: str,
                          text: str | None) -> tuple[str | None, InvalidRequestError | None]:
        from ..grammar.base import GrammarKey
        from ..grammar.compile.limits import GrammarLimits

        limits = GrammarLimits()
        if kind == "json_schema":
            text = self._without_vacuous_bounds(text, sp.max_new_tokens, limits.max_schema_bound)
        try:
            limits.check(GrammarKey.from_constraint(kind, sp.constraint[1] if text is None
                                                    else text))
        except InvalidRequestError as e:
            return text, e
        return text, None

    def _without_vacuous_bounds(self, text: str, max_new_tokens: int, limit: int) -> str:
        """grammar: schema upper bounds this request's output cannot reach, dropped
        (``grammar/compile/vacuous_bounds.py``)."""
        from ..grammar.compile.vacuous_bounds import drop_vacuous_bounds, longest_token_bytes

        if self._token_bytes is None:
            self._token_bytes = longest_token_bytes(self.tokenizer)
        return drop_vacuous_bounds(text, limit, max_new_tokens * self._token_bytes)

    def _spec(self, ids: list[int], sp: SamplingParams, lp: bool, start: Any, top: Any,
              text_in_lp: bool, rid: Any, mm: Any = None) -> GenerateSpec:
        self._check_sizes(len(ids), sp)
        if not isinstance(start, int) or isinstance(start, bool) or not -1 <= start <= len(ids):
            raise InvalidRequestError(f"logprob_start_len must be -1 or in [0, {len(ids)}] "
                                      f"(the prompt length), got {start!r}",
                                      field="logprob_start_len")
        if not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= 1000:
            raise InvalidRequestError(f"top_logprobs_num must be in [0, 1000], got {top!r}",
                                      field="top_logprobs_num")
        rid = str(rid) if rid is not None else uuid.uuid4().hex
        if sp.n == 1:
            reqs = (TokenizedGenerateReq(rid, ids, sp, lp, start, top, mm=mm,
                                         bootstrap=next_bootstrap()),)  # pd:
        else:
            reqs = tuple(TokenizedGenerateReq(f"{rid}-{k}", ids, self._child(sp, k), lp, start, top,
                                              mm=mm, bootstrap=next_bootstrap())  # pd:
                         for k in range(sp.n))
        return GenerateSpec(rid, reqs, text_in_lp)

    @staticmethod
    def _child(sp: SamplingParams, k: int) -> SamplingParams:
        # NOTE: with a seed, the n samples must differ, so each child gets seed + k.
        return sp.replace(n=1, seed=None if sp.seed is None else sp.seed + k)

    def _check_sizes(self, prompt_len: int, sp: SamplingParams) -> None:
        total, ctx = prompt_len + sp.max_new_tokens, self.ready.context_len
        if total > ctx:
            raise ContextLengthError(
                f"prompt ({prompt_len} tokens) + max_new_tokens ({sp.max_new_tokens}) = {total} "
                f"exceeds the context length of {ctx} tokens", field="max_new_tokens")
        if total > self.ready.kv_total_slots:
            raise RequestTooLargeError(
                f"prompt ({prompt_len} tokens) + max_new_tokens ({sp.max_new_tokens}) = {total} "
                f"exceeds the KV cache capacity of {self.ready.kv_total_slots} tokens",
                field="max_new_tokens")


def flatten_ids(specs: Sequence[GenerateSpec]) -> list[str]:
    return [r.rid for s in specs for r in s.reqs]
