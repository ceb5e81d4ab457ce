"""What the notebook shows, built from a state's segments: turns (one per role turn, the chat
template's markup left out), the spans in them (text, generated, images), forks side by side,
the error with its program line, and the program's summary. Rendering is ``html.py``'s job.

The model is rebuilt from the executor on every refresh (cheap: one pass over the segments), so
a streaming program's view never drifts from its state.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    from sgdsl.backends.base import ImageData
    from sgdsl.interpreter.executor import StateExecutor
    from sgdsl.interpreter.records import CallRecord


@dataclass(frozen=True)
class Span:
    kind: str  # text | gen | image
    text: str
    name: str | None = None
    call: "CallRecord | None" = None
    image: "ImageData | None" = None


@dataclass(frozen=True)
class Turn:
    """One block: a role's turn (or role-less text), its spans, and the calls made in it."""

    role: str | None
    spans: tuple[Span, ...]

    @property
    def calls(self) -> tuple["CallRecord", ...]:
        seen: dict[int, CallRecord] = {}
        for span in self.spans:
            if span.call is not None:
                seen.setdefault(id(span.call), span.call)
        return tuple(seen.values())


@dataclass(frozen=True)
class ForkView:
    states: tuple["StateView", ...]
    join_mode: str | None


@dataclass(frozen=True)
class ErrorView:
    message: str
    where: str | None  # the program line that appended the failing node


@dataclass(frozen=True)
class Summary:
    calls: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    cost: float
    elapsed_s: float | None  # None while running

    @property
    def cache_hit(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None


@dataclass(frozen=True)
class StateView:
    items: tuple[Union[Turn, ForkView], ...]
    error: ErrorView | None
    running: bool
    summary: Summary | None  # the top-level state only


def build(ex: "StateExecutor", *, top: bool = True) -> StateView:
    items: list[Union[Turn, ForkView]] = []
    turn: _TurnBuilder | None = None

    def close() -> None:
        nonlocal turn
        if turn is not None and turn.spans:
            items.append(turn.done())
        turn = None

    for seg in ex.segments[ex.fork_segment:]:
        if seg.kind == "begin":
            close()
            turn = _TurnBuilder(seg.role)
        elif seg.kind == "end":
            close()
        elif seg.kind == "fork":
            close()
            items.append(_fork(ex.forks[seg.call]))
        else:
            if turn is None or turn.role != seg.role:
                close()
                turn = _TurnBuilder(seg.role)
            turn.add(_span(ex, seg))
    if turn is not None and (turn.spans or not ex.finished):
        items.append(turn.done())  # an open turn, shown while its first tokens are awaited
    return StateView(tuple(items), _error(ex), not ex.finished, _summary(ex) if top else None)


class _TurnBuilder:
    def __init__(self, role: str | None) -> None:
        self.role, self.spans = role, []

    def add(self, span: Span) -> None:
        self.spans.append(span)

    def done(self) -> Turn:
        return Turn(self.role, tuple(self.spans))


def _span(ex: "StateExecutor", seg: Any) -> Span:
    if seg.kind == "gen":
        call = ex.calls[seg.call] if seg.call is not None and seg.call < len(ex.calls) else None
        return Span("gen", seg.text, seg.name, call)
    if seg.kind == "image":
        return Span("image", seg.text, image=ex.images_[seg.call])
    return Span("text", seg.text)


def _fork(record: Any) -> ForkView:
    return ForkView(tuple(build(child, top=False) for child in record.children), record.join_mode)


def _error(ex: "StateExecutor") -> ErrorView | None:
    exc = ex.error_
    if exc is None:
        return None
    site = getattr(exc, "sgdsl_callsite", None)
    return ErrorView(f"{type(exc).__name__}: {exc}", site.describe() if site is not None else None)


def _summary(ex: "StateExecutor") -> Summary:
    usage = ex.run.usage.as_dict()
    return Summary(usage["calls"], usage["prompt_tokens"], usage["completion_tokens"],
                   usage["cached_tokens"], usage["cost"], ex.run.elapsed_s)
