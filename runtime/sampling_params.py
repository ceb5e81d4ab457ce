"""Per-request sampling parameters of the runtime: one frozen dataclass, validated once at the
boundary (engine or server) before any KV is allocated."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from .errors import InvalidRequestError
from .tokenizer.stop_regex import check_stop_regex

# Fields SGLang's SamplingParams accepts that change nothing here: ``custom_params`` only feed a
# custom logit processor (refused at the request level), ``stream_interval`` is a delivery
# granularity hint. ``sampling_seed`` is SGLang's name for ``seed``.
_IGNORED = frozenset({"custom_params", "stream_interval"})
# Fields SGLang accepts that this runtime cannot honour: refused unless null/empty.
_UNSUPPORTED = ("structural_tag", "logit_bias")


@dataclass(frozen=True)
class SamplingParams:
    """What to sample and when to stop. Field names follow SGLang's native API."""

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 = whole vocabulary
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    stop_regex: tuple[str, ...] = ()  # patterns searched in the output text (runtime/tokenizer/stop_regex.py)
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    seed: int | None = None
    n: int = 1
    # Constraints (at most one); enforced by runtime/grammar.
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "SamplingParams":
        """Build from a JSON-like dict; unknown keys are an error naming the key."""
        if d is None:
            return cls()
        if isinstance(d, SamplingParams):
            return d
        if not isinstance(d, Mapping):
            raise InvalidRequestError("sampling_params must be an object", field="sampling_params")
        d = _sglang_aliases(d)
        unknown = sorted(set(d) - _KNOWN)
        if unknown:
            raise InvalidRequestError(
                f"unknown sampling parameter(s): {', '.join(unknown)}", field=unknown[0]
            )
        kw = {k: v for k, v in d.items() if v is not None or k in ("seed", "json_schema", "regex", "ebnf")}
        for key in ("stop", "stop_regex"):
            if isinstance(kw.get(key), str):
                kw[key] = (kw[key],)
        for key in ("stop", "stop_regex", "stop_token_ids"):
            if key in kw:
                kw[key] = tuple(kw[key])
        if "json_schema" in kw and isinstance(kw["json_schema"], Mapping):
            import json

            kw["json_schema"] = json.dumps(kw["json_schema"])
        params = cls(**kw)
        params.validate()
        return params

    def replace(self, **changes: Any) -> "SamplingParams":
        return dataclasses.replace(self, **changes)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        """Whether sampling depends on the tokens generated so far (penalty counts, the
        min_new_tokens stop mask)."""
        return (self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
                or self.repetition_penalty != 1.0 or self.min_new_tokens > 0)

    @property
    def constraint(self) -> tuple[str, str] | None:
        """(kind, text) of the grammar constraint, if any."""
        for kind in ("json_schema", "regex", "ebnf"):
            value = getattr(self, kind)
            if value is not None:
                return kind, value
        return None

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise InvalidRequestError naming the first bad field and its limit."""
        _int_at_least("max_new_tokens", self.max_new_tokens, 0)
        _int_at_least("min_new_tokens", self.min_new_tokens, 0)
        if self.min_new_tokens > self.max_new_tokens:
            raise InvalidRequestError(
                f"min_new_tokens ({self.min_new_tokens}) must be <= max_new_tokens "
                f"({self.max_new_tokens})", field="min_new_tokens")
        _float_in("temperature", self.temperature, 0.0, 100.0)
        _float_in("top_p", self.top_p, 0.0, 1.0, low_open=True)
        _float_in("min_p", self.min_p, 0.0, 1.0)
        _float_in("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        _float_in("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _float_in("repetition_penalty", self.repetition_penalty, 0.0, 2.0, low_open=True)
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or (
            self.top_k < 1 and self.top_k != -1):
            raise InvalidRequestError(f"top_k must be -1 or an integer >= 1, got {self.top_k!r}",
                                      field="top_k")
        _int_at_least("n", self.n, 1)
        if self.n > 64:
            raise InvalidRequestError(f"n must be <= 64, got {self.n}", field="n")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise InvalidRequestError(f"seed must be an integer, got {self.seed!r}", field="seed")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise InvalidRequestError("stop must be a string or a list of non-empty strings",
                                      field="stop")
        reason = check_stop_regex(self.stop_regex)
        if reason is not None:
            raise InvalidRequestError(reason, field="stop_regex")
        for t in self.stop_token_ids:
            if not isinstance(t, int) or t < 0 or (vocab_size is not None and t >= vocab_size):
                raise InvalidRequestError(
                    f"stop_token_ids entries must be token ids in [0, {vocab_size}), got {t!r}",
                    field="stop_token_ids")
        kinds = [k for k in ("json_schema", "regex", "ebnf") if getattr(self, k) is not None]
        if len(kinds) > 1:
            raise InvalidRequestError(f"at most one of json_schema, regex, ebnf may be set, got {kinds}",
                                      field=kinds[1])


# NOTE: computed once: from_dict runs twice per server request (the server's 400 check, then
# the Engine's), and listing the dataclass's fields was a fifth of its cost (issue 29).
_KNOWN = frozenset(f.name for f in fields(SamplingParams)) - {"extra"}
_ALIAS_KEYS = (*_IGNORED, *_UNSUPPORTED, "sampling_seed")


def _sglang_aliases(d: Mapping[str, Any]) -> Mapping[str, Any]:
    """SGLang-only spellings mapped or dropped (see ``_IGNORED``/``_UNSUPPORTED``)."""
    if not any(k in d for k in _ALIAS_KEYS):
        return d
    out = {k: v for k, v in d.items() if k not in _IGNORED}
    for key in _UNSUPPORTED:
        if out.pop(key, None):
            raise InvalidRequestError(f"{key} is not supported by this server", field=key)
    if "sampling_seed" in out:
        seed = out.pop("sampling_seed")
        if seed is not None:
            if out.get("seed") not in (None, seed):
                raise InvalidRequestError("seed and sampling_seed disagree", field="sampling_seed")
            out["seed"] = seed
    return out


def _int_at_least(name: str, value: Any, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise InvalidRequestError(f"{name} must be an integer >= {low}, got {value!r}", field=name)


def _float_in(name: str, value: Any, low: float, high: float, low_open: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and value <= high
    if not ok:
        bracket = "(" if low_open else "["
        raise InvalidRequestError(f"{name} must be in {bracket}{low}, {high}], got {value!r}",
                                  field=name)
