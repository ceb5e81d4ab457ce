"""Execution of ``gen`` and ``select`` nodes: parameters, lowering, n samples, streaming,
API speculative execution, and the bookkeeping (variables, parsed values, meta_info, usage)."""
from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING, Any

from sgdsl import ir
from sgdsl.backends.base import Backend
from sgdsl.choices import token_length_normalized
from sgdsl.errors import ConstraintViolationError, UnsupportedError
from sgdsl.interpreter.lowering import MAX_ATTEMPTS, Checked, Plan, plan_constraint
from sgdsl.interpreter.stream_meta import merge_chunk

if TYPE_CHECKING:
    from sgdsl.interpreter.executor import StateExecutor

RETRY_TEMPERATURE = 0.7


async def run_gen(ex: "StateExecutor", node: ir.Gen) -> None:
    params = resolve_params(ex, node.params)
    plan = plan_constraint(ex.backend, node.constraint)  # raises before any token is generated
    check_open_turn(ex)
    if node.reasoning is not None:
        from sgdsl.interpreter.reasoning import run_reasoning_gen

        await run_reasoning_gen(ex, node, params, plan)
        return
    if plan.kind == "tools":
        await _gen_tools(ex, node.name, params, plan)
        return
    n = params.resolved("n")
    caps = ex.backend.capabilities
    emulate_stop_regex = bool(params.resolved("stop_regex")) and not caps.stop_regex
    if n > 1:
        await _gen_n(ex, node.name, params, plan, n)
    elif ex.run.stream and not plan.retry and not emulate_stop_regex:
        await _gen_stream(ex, node.name, params, plan)
    elif ex.run.spec_tokens and not caps.chat_only and plan.native is None and not plan.retry:
        text, meta = await _spec_gen(ex, params)
        ex.fill(text, "gen", node.name)
        _store(ex, node.name, text, meta, text)
    else:
        checked, meta = await generate_checked(ex, params, plan)
        ex.fill(checked.text, "gen", node.name)
        _store(ex, node.name, checked.text, meta, checked.parsed)


def resolve_params(ex: "StateExecutor", params: ir.SamplingParams) -> ir.SamplingParams:
    """The gen's own values, then the program-wide defaults; inside a role, completion backends
    also stop at the end-of-turn markers of the chat template (plain-text programs do not)."""
    params = params.merged(ex.run.defaults)
    if ex.template.stop_str and ex.cur_role is not None and not ex.backend.capabilities.chat_only:
        stop = tuple(params.resolved("stop"))
        params = params.replace(stop=stop + tuple(s for s in ex.template.stop_str if s not in stop))
    return params


def check_open_turn(ex: "StateExecutor") -> None:
    caps = ex.backend.capabilities
    if caps.chat_only and ex.cur_role == "assistant" and not caps.partial_assistant:
        partial = ex.text_[ex.cur_role_begin:].strip()
        if partial:
            raise UnsupportedError(
                f"{type(ex.backend).__name__} cannot continue a partly written assistant turn "
                f"({partial[:40]!r}); start the assistant turn with gen(), or use a backend that "
                "supports assistant prefill")


async def generate_checked(ex: "StateExecutor", params: ir.SamplingParams,
                           plan: Plan) -> tuple[Checked, dict[str, Any]]:
    """One completion, validated; retried up to MAX_ATTEMPTS times when the plan says so."""
    attempts = MAX_ATTEMPTS if plan.retry else 1
    if params.n not in (None, 1):
        params = params.replace(n=1)
    checked = Checked(False, "")
    for attempt in range(attempts):
        vouched = False
        if attempt and params.resolved("temperature") == 0:
            # NOTE: a greedy retry would repeat the same output; sample instead.
            params = params.replace(temperature=RETRY_TEMPERATURE)
        if params.resolved("stop_regex") and not ex.backend.capabilities.stop_regex:
            text, meta = await _stream_to_stop_regex(ex, params, plan)
        else:
            results = await ex.backend.generate(ex.context(), params, plan.native)
            text, meta = results[0].text, dict(results[0].meta_info)
            vouched = results[0].schema_checked
        ex.run.usage.add(meta)
        checked = plan.check_result(text, vouched)
        if checked.ok or not plan.retry:
            meta["attempts"] = attempt + 1
            if not checked.ok:
                meta["parse_error"] = checked.reason
            return checked, meta
    raise ConstraintViolationError(
        f"{type(ex.backend).__name__} has no native {plan.kind} constraint, and none of "
        f"{attempts} attempts produced valid output; the last one {checked.reason}: {checked.text[:200]!r}",
        kind=plan.kind or "", attempts=attempts, last_output=checked.text)


async def _stream_to_stop_regex(ex: "StateExecutor", params: ir.SamplingParams,
                                plan: Plan) -> tuple[str, dict[str, Any]]:
    """``stop_regex`` on a backend without it (OpenAI, Anthropic): stream, and at the first
    match stop reading, which cancels the request (the backend aborts it on close), and cut
    the text at the match start, as the runtime does."""
    patterns = [re.compile(p) for p in params.resolved("stop_regex")]
    text, meta = "", {}
    # NOTE: the backend is asked without stop_regex: it cannot enforce it, this loop does.
    stream = ex.backend.stream(ex.context(), params.replace(stop_regex=()), plan.native)
    try:
        async for chunk in stream:
            text += chunk.text
            if chunk.meta_info:
                meta = dict(chunk.meta_info)
            hits = [(m.start(), p.pattern) for p in patterns if (m := p.search(text))]
            if hits:
                pos, pattern = min(hits)
                meta["finish_reason"] = {"type": "stop", "matched": pattern}
                return text[:pos], meta
    finally:
        await stream.aclose()
    return text, meta


async def _gen_n(ex: "StateExecutor", name: str | None, params: ir.SamplingParams,
                 plan: Plan, n: int) -> None:
    emulate = bool(params.resolved("stop_regex")) and not ex.backend.capabilities.stop_regex
    if ex.backend.capabilities.native_n and not plan.retry and not emulate:
        results = await ex.backend.generate(ex.context(), params, plan.native)
        metas = [dict(r.meta_info) for r in results]
        ex.run.usage.add(_sum_meta(metas))
        checked = [plan.check_result(r.text, r.schema_checked) for r in results]
    else:  # one request per sample, concurrently
        pairs = await asyncio.gather(*(generate_checked(ex, params, plan) for _ in range(n)))
        checked, metas = [c for c, _ in pairs], [m for _, m in pairs]
    texts = [c.text for c in checked]
    # NOTE: as in SGLang, the variable holds all n samples and the text continues with the first.
    ex.fill(texts[0], "gen", name)
    meta = _sum_meta(metas) | {"choices": metas}
    _store(ex, name, texts, meta, [c.parsed for c in checked])


def _sum_meta(metas: list[dict[str, Any]]) -> dict[str, Any]:
    total = dict(metas[0]) if metas else {}
    total["completion_tokens"] = sum(int(m.get("completion_tokens") or 0) for m in metas)
    total["finish_reason"] = [m.get("finish_reason") for m in metas]
    return total


async def _gen_stream(ex: "StateExecutor", name: str | None, params: ir.SamplingParams,
                      plan: Plan) -> None:
    if name is not None:
        ex.variables[name] = ""
    meta: dict[str, Any] = {}
    parts: list[str] = []
    live: dict[str, Any] | None = None  # the chunks' meta_info so far (stream_meta)
    async for chunk in ex.backend.stream(ex.context(), params, plan.native):
        # NOTE: the last chunk's meta_info is the whole result's; earlier ones are their own.
        live = dict(chunk.meta_info) if chunk.done else merge_chunk(live, chunk.meta_info)
        if chunk.text:
            parts.append(chunk.text)
            if name is not None:
                ex.variables[name] += chunk.text
                ex.meta_info[name] = live
            ex.fill(chunk.text, "gen", name)
        if chunk.meta_info:
            meta = dict(chunk.meta_info)
    ex.run.usage.add(meta)
    text = "".join(parts)
    _store(ex, name, text, meta, plan.check(text).parsed)


async def _spec_gen(ex: "StateExecutor", params: ir.SamplingParams) -> tuple[str, dict[str, Any]]:
    """API speculative execution (``@function(num_api_spec_tokens=N)``): one request generates
    at least N tokens with no stop strings; this gen and the following ones (and the constant
    text between them) are then read from that speculated continuation."""
    meta: dict[str, Any] = {"speculative": True}
    if not ex.speculated:
        spec = params.replace(stop=(), n=1,
                                   max_tokens=max(params.resolved("max_tokens"), ex.run.spec_tokens or 0))
        result = (await ex.backend.generate(ex.context(), spec, None))[0]
        meta |= dict(result.meta_info)
        ex.run.usage.add(meta)
        ex.speculated = result.text
    stops = [i for s in params.resolved("stop") if (i := ex.speculated.find(s)) != -1]
    cut = min(stops) if stops else len(ex.speculated)
    text, ex.speculated = ex.speculated[:cut], ex.speculated[cut:]
    return text, meta


async def _gen_tools(ex: "StateExecutor", name: str | None, params: ir.SamplingParams,
                     plan: Plan) -> None:
    """A gen that may call tools: its text, then its calls (also written into the transcript,
    so that later turns see them), parsed into ``state.tool_calls(name)``."""
    from sgdsl.tools import calls_of, render_calls

    result = (await ex.backend.generate(ex.context(), params.replace(n=1), plan.native))[0]
    meta = dict(result.meta_info)
    ex.run.usage.add(meta)
    calls = calls_of(meta)
    shown = result.text + ("\n" if result.text and calls else "") + render_calls(calls)
    ex.fill(shown, "gen", name)
    _store(ex, name, result.text, meta, calls)


def _store(ex: "StateExecutor", name: str | None, value: Any, meta: dict[str, Any], parsed: Any) -> None:
    if ex.call_ is not None:
        ex.call_.meta = meta
    if name is None:
        return
    ex.variables[name] = value
    ex.parsed[name] = parsed
    ex.meta_info[name] = meta


async def run_select(ex: "StateExecutor", node: ir.Select) -> None:
    if not node.choices:
        raise ValueError("select() needs at least one choice")
    method = node.choices_method or token_length_normalized
    backend = ex.backend
    if backend.capabilities.prompt_logprobs or type(backend).select is not Backend.select:
        result = await backend.select(ex.context(), list(node.choices), node.temperature, method)
        index, meta = result.index, dict(result.meta_info)
        ex.run.usage.add(meta)
    else:
        index, meta = await _select_by_generation(ex, node)
    decision = node.choices[index]
    ex.fill(decision, "gen", node.name)
    _store(ex, node.name, decision, meta, decision)


async def _select_by_generation(ex: "StateExecutor", node: ir.Select) -> tuple[int, dict[str, Any]]:
    """Backends that can neither score nor select: constrain (or validate) a short generation."""
    plan = plan_constraint(ex.backend, ir.Constraint("choices", tuple(node.choices)))
    longest = max(len(c) for c in node.choices)
    params = ir.SamplingParams(max_tokens=longest + 8, temperature=node.temperature)
    checked, meta = await generate_checked(ex, resolve_params(ex, params), plan)
    if checked.text not in node.choices:
        raise ConstraintViolationError(
            f"select: {type(ex.backend).__name__} produced {checked.text!r}, not one of {list(node.choices)!r}",
            kind="choices", attempts=meta.get("attempts", 1), last_output=checked.text)
    return node.choices.index(checked.text), meta
