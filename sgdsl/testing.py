"""``ScriptedBackend``: a deterministic backend for tests of programs and of the interpreter.

It returns scripted outputs (a list consumed in order, or a function of the request), records
every call, scores ``select`` choices from a table, can hold a call until released (to test
cancellation, which it records as an abort), and can fail on demand.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Sequence

from sgdsl.backends.base import (Backend, Capabilities, ChoiceScores, Context, GenResult,
                                 StreamChunk)
from sgdsl.ir import Constraint, SamplingParams

Script = Callable[[Context, SamplingParams, "Constraint | None"], str]


@dataclass
class Call:
    kind: str  # generate | stream | score | cache
    context: Context
    params: SamplingParams | None = None
    constraint: Constraint | None = None
    choices: tuple[str, ...] = ()


@dataclass
class ScriptedBackend(Backend):
    outputs: Sequence[str] | Script = ()
    choice_logprobs: dict[str, Sequence[float]] = field(default_factory=dict)
    capabilities: Capabilities = Capabilities(prompt_logprobs=True, output_logprobs=True, stop_regex=True)
    template: Any = None
    hold: bool = False  # generate/stream wait for release() (to test cancellation)
    fail_with: BaseException | None = None
    extra_meta: dict[str, Any] = field(default_factory=dict)  # merged into every meta_info

    def __post_init__(self) -> None:
        self.calls: list[Call] = []
        self.aborted = 0
        self._next = 0
        # NOTE: made lazily, on the loop the program runs on.
        self._released: asyncio.Event | None = None
        self._started: asyncio.Event | None = None

    def chat_template(self) -> Any:
        return self.template

    # ---- scripting ----------------------------------------------------------------------

    def _output(self, ctx: Context, params: SamplingParams, constraint: Constraint | None) -> str:
        if callable(self.outputs):
            return self.outputs(ctx, params, constraint)
        if self._next >= len(self.outputs):
            raise IndexError(f"ScriptedBackend ran out of outputs after {self._next} call(s)")
        self._next += 1
        text = self.outputs[self._next - 1]
        for stop in params.resolved("stop"):
            if stop and stop in text:
                text = text[:text.index(stop)]
        return text

    async def _gate(self) -> None:
        if self.fail_with is not None:
            raise self.fail_with
        if not self.hold:
            return
        self._events()
        self._started.set()
        try:
            await self._released.wait()
        except asyncio.CancelledError:
            self.aborted += 1  # a real backend aborts its in-flight request here
            raise

    def _events(self) -> None:
        if self._released is None:
            self._released, self._started = asyncio.Event(), asyncio.Event()

    async def wait_started(self) -> None:
        """Until a held call is in flight."""
        self._events()
        await self._started.wait()

    def release(self) -> None:
        self._events()
        self._released.set()

    def _meta(self, ctx: Context, text: str) -> dict[str, Any]:
        return {"prompt_tokens": len(ctx.text.split()), "completion_tokens": len(text.split()),
                "finish_reason": "stop", "cost": 0.001, **self.extra_meta}

    # ---- Backend ------------------------------------------------------------------------

    async def generate(self, ctx: Context, params: SamplingParams,
                       constraint: Constraint | None = None) -> list[GenResult]:
        self.calls.append(Call("generate", ctx, params, constraint))
        await self._gate()
        texts = [self._output(ctx, params, constraint) for _ in range(params.resolved("n"))]
        return [GenResult(t, self._meta(ctx, t)) for t in texts]

    async def stream(self, ctx: Context, params: SamplingParams,
                     constraint: Constraint | None = None) -> AsyncIterator[StreamChunk]:
        self.calls.append(Call("stream", ctx, params, constraint))
        await self._gate()
        text = self._output(ctx, params, constraint)
        words = text.split(" ")
        for i, word in enumerate(words):
            yield StreamChunk(word if i == 0 else " " + word)
            await asyncio.sleep(0)
        yield StreamChunk("", done=True, meta_info=self._meta(ctx, text))

    async def score_choices(self, ctx: Context, choices: Sequence[str],
                            unconditional: bool = False) -> ChoiceScores:
        self.calls.append(Call("score", ctx, choices=tuple(choices)))
        rows = tuple(tuple(self.choice_logprobs.get(c, [-5.0] * max(len(c.split()), 1))) for c in choices)
        uncond = tuple(tuple(v - 1.0 for v in row) for row in rows) if unconditional else None
        return ChoiceScores(rows, uncond, {"prompt_tokens": len(ctx.text.split()), "completion_tokens": 0})

    async def cache_prefix(self, ctx: Context) -> None:
        self.calls.append(Call("cache", ctx))
