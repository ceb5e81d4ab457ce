"""``gen`` under ``separate_reasoning``: the think section goes to ``<name>_reasoning_content``,
the answer to ``<name>`` and to the program's text. Streamed runs route each delta as it comes
(``ProgramState.text_iter(name)`` shows the answer only); others split the finished text."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sgdsl import ir
from sgdsl.interpreter.lowering import Plan
from sgdsl.reasoning import ReasoningSplitter

if TYPE_CHECKING:
    from sgdsl.interpreter.executor import StateExecutor


async def run_reasoning_gen(ex: "StateExecutor", node: ir.Gen, params: ir.SamplingParams,
                            plan: Plan) -> None:
    from sgdsl.interpreter.generation import generate_checked

    splitter = ReasoningSplitter(node.reasoning)
    _init(ex, node)
    stream = ex.run.stream and not plan.retry and params.resolved("n") == 1 \
        and not params.resolved("stop_regex")
    if stream:
        meta: dict[str, Any] = {}
        async for chunk in ex.backend.stream(ex.context(), params, plan.native):
            _route(ex, node, *splitter.push(chunk.text))
            if chunk.meta_info:
                meta = dict(chunk.meta_info)
        ex.run.usage.add(meta)
    else:
        checked, meta = await generate_checked(ex, params.replace(n=1), plan)
        _route(ex, node, *splitter.push(checked.text))
    _route(ex, node, *splitter.finish())
    if node.name is not None:
        ex.parsed[node.name] = plan.check(splitter.answer).parsed
        ex.meta_info[node.name] = meta | {"reasoning_content": splitter.reasoning}


def _init(ex: "StateExecutor", node: ir.Gen) -> None:
    if node.name is not None:
        ex.variables[node.name] = ""
        ex.variables[node.reasoning_name] = ""


def _route(ex: "StateExecutor", node: ir.Gen, reasoning: str, answer: str) -> None:
    if node.name is not None:
        ex.variables[node.reasoning_name] += reasoning
        ex.variables[node.name] += answer
    ex.fill(answer, "gen", node.name)
    if reasoning and ex.run.stream:
        ex.signal.notify()
