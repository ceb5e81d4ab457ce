"""What forced completion keeps: its knobs (``CompletionConfig``, fed by the
``EngineConfig.grammar_*`` fields) and one request's tracking state (``Budget``, kept as
``req.completion``); ``completion.py`` says how they are used."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...errors import InvalidRequestError


@dataclass(frozen=True)
class CompletionConfig:
    """Forced-completion knobs (``EngineConfig.grammar_*`` fields feed them)."""

    enabled: bool = True
    # Force when remaining <= need + slack: room for a sampled token that raises ``need``.
    slack_tokens: int = 4
    repetition_window: int = 32  # 0 turns the repetition guard off
    max_expansions: int = 256  # search work per measurement
    async_estimates: bool = True  # estimates far from the end in a worker process

    def __post_init__(self) -> None:
        for name in ("slack_tokens", "repetition_window", "max_expansions"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                field = {"slack_tokens": "grammar_completion_slack",
                         "repetition_window": "grammar_repetition_window"}.get(name, name)
                raise InvalidRequestError(f"{field} must be an integer >= 0, got {value!r}",
                                          field=field)


@dataclass
class Budget:
    """One request's tracking state (``req.completion``)."""

    check_at: int = 0  # output length of the next measurement
    search_at: int = 0  # output length of the next search (the rest only check repetition)
    plan: str | None = None  # text of the last completion found
    plan_at: int = 0  # output length when it was found
    need: int = 0  # tokens it takes, stop token included
    finishing: bool = False  # forced and applied; a logprob request awaits their scoring
    checked: bool = False  # the plan was replayed from this state (not a shared estimate)
    peak: int = 0  # the largest need measured
    failures: int = 0  # searches in a row that found nothing (deep ones included)
    last_resorts: int = 0  # deep searches made after repeated failures (_last_resort)
    job: Any = None  # estimate.Pending: a search out in the estimate worker
    # (tokens scanned, the output there ends inside a JSON string, after a backslash): kept
    # at plan_at by _record (see _lex)
    lex: tuple[int, bool, bool] = (0, False, False)
    # _plan_ahead's answers for (output length, plan_at, plan) = ahead_key
    ahead_key: tuple | None = None
    ahead: dict = field(default_factory=dict)
