"""Tool calls on the runtime backends (Local, RuntimeEndpoint), as the server does them: the
call object is generated under a JSON schema made of the tools' own schemas (name first, then
that tool's arguments), so its arguments always parse and validate. With ``auto`` the model
writes freely until it opens a call (``<tool_call>``, Hermes style), and the call is then
constrained. The program itself describes the tools to the model (the prompt is its text).
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


def _merged(metas: list[Any]) -> dict[str, Any]:
    meta = dict(metas[-1])
    meta["prompt_tokens"] = metas[0].get("prompt_tokens", 0)
    meta["completion_tokens"] = sum(m.get("completion_tokens", 0) for m in metas)
    return meta
