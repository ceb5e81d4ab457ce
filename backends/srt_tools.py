"""Tool calls on the runtime backends (Local, RuntimeEndpoint), as the server does them: the
call object is generated under a JSON schema made of the tools' own schemas (name first, then
that tool's arguments), so its arguments always parse and validate. With ``auto`` the model
writes freely until it opens a call (``<tool_call>``, Hermes style), and the call is then
constrained. In a program with roles, the request's prompt lists the tools in its system turn
(the server's fallback listing, docs/tools.md); the program's own text is left as it is.
"""
from __future__ import annotations

import dataclasses
import json
import uuid
from typing import TYPE_CHECKING, Any

from sgdsl.ir import Constraint, SamplingParams
from sgdsl.tools import ToolSet

from .base import Context, GenResult

if TYPE_CHECKING:
    from .srt import SrtBackend

OPENER, FORCED_PREFIX = "<tool_call>", "<tool_call>\n"


async def generate_tools(backend: "SrtBackend", ctx: Context, params: SamplingParams,
                         tools: ToolSet) -> list[GenResult]:
    from sgdsl.runtime.function_call import get_format
    from sgdsl.runtime.function_call.call_stream import arguments_text

    if tools.choice == "none":
        return await backend.generate(ctx, params)
    ctx = with_tool_listing(ctx, backend.chat_template(), tools)
    text, metas = "", []
    if tools.choice == "auto":
        stops = tuple(params.stop or ()) + (OPENER,)
        first = (await backend.generate(ctx, params.replace(stop=stops)))[0]
        metas.append(first.meta_info)
        if (first.meta_info.get("finish_reason") or {}).get("matched") != OPENER:
            return [first]
        text = first.text
    by_name = {t.name: t for t in tools.tools}
    schema = get_format("hermes").call_schema(
        [(n, by_name[n].parameters) for n in tools.names()])
    call_ctx = dataclasses.replace(ctx, text=ctx.text + text + FORCED_PREFIX)
    left = params.resolved("max_tokens") - sum(m.get("completion_tokens", 0) for m in metas)
    out = (await backend.generate(call_ctx, params.replace(stop=(), max_tokens=max(left, 1)),
                                  Constraint("json_schema", json.dumps(schema))))[0]
    metas.append(out.meta_info)
    parsed = arguments_text(out.text)
    meta = _merged(metas)
    if parsed is None:  # cut short: no call, and the partial text is kept
        return [GenResult(text + FORCED_PREFIX + out.text, meta)]
    meta["tool_calls"] = [{"id": f"call_{uuid.uuid4().hex[:24]}", "name": parsed[0],
                           "arguments": parsed[1]}]
    return [GenResult(text, meta)]


def with_tool_listing(ctx: Context, template: Any, tools: ToolSet) -> Context:
    """``ctx`` with the tool listing in its system turn (one added if there is none).

    NOTE: the prompt is rebuilt from ``ctx.messages`` with the template's role markers; where
    that does not give back ``ctx.text`` exactly (images, text outside turns), the context is
    sent unchanged rather than guessed at.
    """
    from sgdsl.runtime.function_call.prompt import tool_system_prompt

    if template is None or not ctx.messages or ctx.images:
        return ctx
    messages = [(m.role, m.content) for m in ctx.messages]
    if _render(template, messages, ctx.open_role) != ctx.text:
        return ctx
    listing = tool_system_prompt([{"type": "function", "function": {
        "name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in tools.tools])
    if messages[0][0] == "system":
        messages[0] = ("system", messages[0][1] + "\n\n" + listing)
    else:
        messages.insert(0, ("system", listing))
    return dataclasses.replace(ctx, text=_render(template, messages, ctx.open_role))


def _render(template: Any, messages: list[tuple[str, str]], open_role: str | None) -> str:
    out = []
    for i, (role, content) in enumerate(messages):
        prefix, suffix = template.get_prefix_and_suffix(role)
        is_open = i == len(messages) - 1 and role == open_role
        out.append(prefix + content + ("" if is_open else suffix))
    return "".join(out)


def _merged(metas: list[Any]) -> dict[str, Any]:
    meta = dict(metas[-1])
    meta["prompt_tokens"] = metas[0].get("prompt_tokens", 0)
    meta["completion_tokens"] = sum(m.get("completion_tokens", 0) for m in metas)
    return meta
