"""One assistant turn with tools and/or a reasoning section, as protocol-neutral events
(``TextDelta``, ``ReasoningDelta``, ``CallStart``, ``ArgsDelta``, then one ``TurnEnd``) that the
OpenAI and Anthropic routes turn into their own responses, streamed or not.

A turn runs in up to three phases, each one engine request continuing the previous text (the
radix cache makes the continuation's prefill cheap):

1. reasoning (with a reasoning parser): free text up to ``</think>``;
2. the answer: free text, stopped at the format's call opener when tools are offered ("auto");
3. a call: the opener, then one call object constrained by a JSON schema made of the tools'
   own schemas, so the arguments always parse and validate. "required"/named choices start
   here directly. A grammar the request brings (json_schema, regex...) applies to phase 2.

NOTE: one constrained call per turn; with "auto" a format whose calls have no opener (Llama-3's
bare JSON) is parsed from the finished text instead, unconstrained, and streamed as text.
"""
from __future__ import annotations

import re
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from fastapi import Request

from ..function_call import ToolCall
from ..function_call.call_stream import CallStreamer, arguments_text, partial_arguments
from .context import ServerContext
from .engine_client import GenBatch
from .reasoning import ReasoningFormat
from .tools import ToolPlan

_CONSTRAINTS = ("json_schema", "regex", "ebnf")


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    name: str


@dataclass(frozen=True)
class ArgsDelta:
    index: int
    text: str


@dataclass(frozen=True)
class TurnEnd:
    """``reason``: "stop" | "length" | "tool_calls"; ``matched``: a stop string/regex/token."""

    reason: str
    text: str
    reasoning: str | None
    calls: tuple[ToolCall, ...]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    matched: Any = None


@dataclass
class _Turn:
    c: ServerContext
    prompt: str
    sampling: dict[str, Any]
    plan: ToolPlan | None
    reasoning: ReasoningFormat | None
    stream: bool
    request: Request | None
    used: int = 0  # completion tokens of the phases so far
    prompt_tokens: int | None = None
    cached_tokens: int = 0
    last_meta: dict[str, Any] = field(default_factory=dict)
    images: list[Any] | None = None  # mm:

    @property
    def remaining(self) -> int:
        return max(int(self.sampling.get("max_new_tokens", 128)) - self.used, 0)

    async def phase(self, text: str, internal_stream: bool = False,
                    **changes: Any) -> AsyncIterator[tuple[str, bool]]:
        """Run one phase on prompt+``text``: (text delta, finished) pairs."""
        limit = min(changes.pop("max_new_tokens", self.remaining), self.remaining)
        sampling = {**self.sampling, **changes, "max_new_tokens": limit}
        sampling = {k: v for k, v in sampling.items() if v is not None}
        ids = await self.c.encode_chat_async(self.prompt + text)
        batch = GenBatch.fan_out([ids], self.c.sampling(sampling),
                                 image_data=[self.images] if self.images else None)  # mm:
        if not (self.stream or internal_stream):
            out = (await self.c.client.run(batch, self.request))[0]
            self._account(out["meta_info"])
            yield out["text"], True
            return
        sent = ""
        async with aclosing(self.c.client.stream(batch)) as chunks:
            async for _, chunk in chunks:
                done = chunk["meta_info"].get("finish_reason") is not None
                if done:
                    self._account(chunk["meta_info"])
                yield chunk["text"][len(sent):], done
                sent = chunk["text"]

    def _account(self, meta: dict[str, Any]) -> None:
        self.used += int(meta.get("completion_tokens", 0))
        if self.prompt_tokens is None:
            self.prompt_tokens = int(meta.get("prompt_tokens", 0))
            self.cached_tokens = int(meta.get("cached_tokens", 0))
        self.last_meta = meta

    @property
    def finish(self) -> dict[str, Any]:
        return self.last_meta.get("finish_reason") or {}

    def end(self, reason: str, text: str, reasoning: str | None,
            calls: tuple[ToolCall, ...] = ()) -> TurnEnd:
        matched = self.finish.get("matched") if reason == "stop" else None
        return TurnEnd(reason, text, reasoning, calls, self.prompt_tokens or 0, self.used,
                       self.cached_tokens, matched)


def has_constraint(sampling: dict[str, Any]) -> bool:
    return any(sampling.get(k) is not None for k in _CONSTRAINTS)


async def run_turn(c: ServerContext, prompt: str, sampling: dict[str, Any],
                   plan: ToolPlan | None, reasoning: ReasoningFormat | None, stream: bool,
                   request: Request | None = None, images: list[Any] | None = None
                   ) -> AsyncIterator[Any]:
    """The turn's events; see the module docstring. ``images`` (mm): the prompt's images,
    sent with every phase (the phases' shared prefix is a radix hit)."""
    turn = _Turn(c, prompt, dict(sampling), plan, reasoning, stream, request, images=images)
    so_far, thought = "", None
    if reasoning is not None:
        async for event in _reasoning_phase(turn):
            if isinstance(event, TurnEnd):
                yield event
                return
            if isinstance(event, tuple):
                so_far, thought = event
            else:
                yield event
    tools = plan is not None and plan.active
    if tools and plan.mode == "required":
        async for event in _call_phase(turn, so_far, "", thought):
            yield event
        return
    async for event in _answer_phase(turn, so_far, thought, plan if tools else None):
        yield event


async def _reasoning_phase(turn: _Turn) -> AsyncIterator[Any]:
    """ReasoningDelta events, then (text so far, reasoning) for the answer to continue, or a
    TurnEnd if the section never closed (max tokens, or EOS inside it)."""
    fmt = turn.reasoning
    assert fmt is not None
    splitter, raw = fmt.splitter(), ""
    free = {k: None for k in _CONSTRAINTS}
    # NOTE: streamed internally even for plain requests, so that an answer without a think
    # section is abandoned (its stream closed, the request aborted) as soon as that shows.
    phase = turn.phase("", internal_stream=True, stop=[fmt.end], stop_regex=None, **free)
    async with aclosing(phase):
        async for delta, _ in phase:
            raw += delta
            piece = splitter.push(delta)
            if splitter.thinking is False:
                break
            if piece:
                yield ReasoningDelta(piece)
    if splitter.thinking is False:
        # The model answered without thinking; the answer is generated again after an empty
        # section, under the request's own sampling, stop strings and grammar.
        yield fmt.empty_section(), None
    elif turn.finish.get("matched") == fmt.end:
        yield raw + fmt.end, splitter.text
    else:
        yield turn.end(_reason(turn), "", fmt.text_of_unclosed(raw).strip())


def _reason(turn: _Turn) -> str:
    return "length" if turn.finish.get("type") == "length" else "stop"


async def _answer_phase(turn: _Turn, so_far: str, thought: str | None,
                        plan: ToolPlan | None) -> AsyncIterator[Any]:
    extra: dict[str, Any] = {}
    stops: tuple[Any, ...] = ()
    if plan is not None:
        opener = plan.fmt.opener
        stop_id = _single_token(turn.c, opener)
        if stop_id is not None:
            extra["stop_token_ids"] = list(turn.sampling.get("stop_token_ids") or []) + [stop_id]
        else:
            extra["stop"] = _as_list(turn.sampling.get("stop")) + [opener]
        stops = (opener,) if stop_id is None else (opener, stop_id)
    text, sent = "", 0
    async for delta, _ in turn.phase(so_far, **extra):
        text += delta
        # NOTE: after a reasoning section the answer's leading whitespace is not content.
        shown = text.lstrip() if thought is not None else text
        start = len(text) - len(shown)
        if len(text) > max(sent, start):
            yield TextDelta(text[max(sent, start):])
            sent = len(text)
    answer = text.lstrip() if thought is not None else text
    if plan is not None and turn.finish.get("matched") in stops:
        async for event in _call_phase(turn, so_far + text, answer, thought):
            yield event
        return
    if plan is not None:
        parsed = plan.fmt.parse(answer)
        calls = tuple(c for c in parsed.calls if c.name in plan.allowed)
        if calls and len(calls) == len(parsed.calls):
            yield turn.end("tool_calls", parsed.normal_text, thought, calls)
            return
    yield turn.end(_reason(turn), answer, thought)


async def _call_phase(turn: _Turn, so_far: str, text: str,
                      thought: str | None) -> AsyncIterator[Any]:
    """One constrained call, then (``plan.parallel``, formats with a closer) as many more as
    the model opens, each asked with a grammar that allows only the opener or the end."""
    fmt = turn.plan.fmt  # type: ignore[union-attr]
    calls: list[ToolCall] = []
    context = so_far + fmt.forced_prefix
    while True:
        box: dict[str, Any] = {}
        async for event in _one_call(turn, context, len(calls), box):
            yield event
        if "call" not in box:  # cut short (max tokens): the partial call is reported as it is
            partial = box.get("partial")
            calls += [ToolCall(*partial)] if partial else []
            shown = text if calls else text + fmt.forced_prefix + box["raw"]
            yield turn.end("length", shown, thought, tuple(calls))
            return
        calls.append(box["call"])
        context += box["raw"] + fmt.closer
        if not (turn.plan.parallel and fmt.closer) or not await _opens_another(turn, context):
            break
        context += fmt.forced_prefix
    reason = "length" if turn.finish.get("type") == "length" else "tool_calls"
    yield turn.end(reason, text, thought, tuple(calls))


async def _one_call(turn: _Turn, context: str, index: int,
                    box: dict[str, Any]) -> AsyncIterator[Any]:
    """Generate call ``index`` after ``context``; ``box`` gets its raw text and the call (or
    the partial call when cut short)."""
    streamer, raw = CallStreamer(), ""
    constraint = {k: None for k in _CONSTRAINTS} | {"json_schema": turn.plan.call_schema()}
    async for delta, _ in turn.phase(context, stop=None, stop_regex=None, **constraint):
        raw += delta
        had_name = streamer.name is not None
        piece = streamer.push(raw)
        if streamer.name is not None and not had_name:
            yield CallStart(index, streamer.name)
        if piece:
            yield ArgsDelta(index, piece)
    box["raw"] = raw
    parsed = arguments_text(raw)
    if parsed is None:
        box["partial"] = partial_arguments(raw)
        return
    tail = streamer.finish(raw)
    if tail:
        yield ArgsDelta(index, tail)
    box["call"] = ToolCall(parsed[0], parsed[1])


async def _opens_another(turn: _Turn, context: str) -> bool:
    """Whether the model opens one more call: its only choices are the opener or the end."""
    opener = turn.plan.fmt.opener  # type: ignore[union-attr]
    budget = len(turn.c.engine.tokenizer.encode(opener, add_special_tokens=False)) + 1
    if turn.remaining <= budget:
        return False
    constraint = {k: None for k in _CONSTRAINTS} | {"regex": f"({re.escape(opener)})?"}
    out = ""
    async for delta, _ in turn.phase(context, internal_stream=False, stop=None, stop_regex=None,
                                     max_new_tokens=budget, **constraint):
        out += delta
    return out == opener


def _single_token(c: ServerContext, text: str) -> int | None:
    """The id of ``text`` if the tokenizer has it as one token (stopped by id: a special
    token's text is not in the decoded output)."""
    if not text:
        return None
    ids = c.engine.tokenizer.encode(text, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)
