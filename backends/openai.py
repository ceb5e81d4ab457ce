"""``OpenAI``: programs run on an OpenAI-compatible API through the official ``openai`` client
(``AsyncOpenAI``). Chat models take messages (images as data URLs); completion models take the
program text. ``json_schema`` is enforced natively with a strict ``response_format``; regex and
EBNF are not (the interpreter validates and retries). ``select`` scores choices by prompt
logprobs (``echo``) on completion models and asks chat models for an enum-constrained JSON
answer."""
from __future__ import annotations

import asyncio
import json
import os
from typing import Any, AsyncIterator, Sequence

from sgdsl.ir import Constraint, SamplingParams

from ._common import (as_schema, backend_error, chat_messages, choice_schema, data_url,
                      finish_reason, parse_choice, split_extensions, wants_extensions)
from .base import (Backend, Capabilities, ChoiceScores, Context, GenResult, SelectResult,
                   StreamChunk, UnsupportedError)
from .loop_local import LoopLocal
from .tool_calls import openai_calls, openai_tools

_NATIVE = ("temperature", "top_p", "n", "stop", "seed", "frequency_penalty", "presence_penalty",
           "max_tokens")


class OpenAI(Backend):
    """``OpenAI("gpt-4o-mini")``; ``base_url``/``api_key`` default to ``OPENAI_BASE_URL`` /
    ``OPENAI_API_KEY``. ``extensions`` sends top_k, min_p, min_tokens... in ``extra_body``
    (default: on for self-hosted servers, off for api.openai.com)."""

    name = "OpenAI"

    def __init__(self, model_name: str, *, base_url: str | None = None,
                 api_key: str | None = None, is_chat_model: bool | None = None,
                 extensions: bool | None = None, **client_options: Any) -> None:
        import openai  # the official client; imported only when a backend is built

        self._openai = openai
        self.model_name = model_name
        base_url = base_url or os.environ.get("OPENAI_BASE_URL")
        api_key = api_key or os.environ.get("OPENAI_API_KEY") or ("EMPTY" if base_url else None)
        self.is_chat_model = (is_chat_model if is_chat_model is not None
                              else "instruct" not in model_name)
        self.extensions = (wants_extensions(base_url, "api.openai.com")
                           if extensions is None else extensions)
        self._clients = LoopLocal(lambda: openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key, **client_options))
        native = {"json_schema", "tools"} if self.is_chat_model else set()
        if self.extensions:  # sgdsl/SGLang/vLLM servers take regex/ebnf/json_schema fields
            native |= {"regex", "ebnf", "json_schema"}
        self.capabilities = Capabilities(
            chat_only=self.is_chat_model, constraints=frozenset(native),
            prompt_logprobs=not self.is_chat_model, output_logprobs=True,
            images=self.is_chat_model, native_n=True)

    def get_model_name(self) -> str:
        return self.model_name

    # ---- requests ---------------------------------------------------------------------------

    def _request(self, ctx: Context, params: SamplingParams,
                 constraint: Constraint | None) -> dict[str, Any]:
        if params.stop_regex:
            raise UnsupportedError("OpenAI API has no stop_regex")
        extra = split_extensions(params, _NATIVE, self.name, self.extensions)
        req: dict[str, Any] = {"model": self.model_name,
                               "max_tokens": params.resolved("max_tokens")}
        for key in ("temperature", "top_p", "n", "seed", "frequency_penalty", "presence_penalty"):
            if getattr(params, key) is not None:
                req[key] = getattr(params, key)
        if params.stop:
            req["stop"] = list(params.stop)
        if extra:
            req["extra_body"] = extra
        if self.is_chat_model:
            req["messages"] = self._messages(ctx)
            if params.return_logprob:
                req["logprobs"] = True
                req["top_logprobs"] = params.top_logprobs_num or 0
        else:
            if ctx.images:
                raise UnsupportedError(f"OpenAI completion model {self.model_name!r} takes no images")
            req["prompt"] = ctx.text
            if params.return_logprob:
                req["logprobs"] = params.top_logprobs_num or 0
        if constraint is not None:
            self._add_constraint(req, constraint)
        return req

    def _add_constraint(self, req: dict[str, Any], constraint: Constraint) -> None:
        """json_schema as a strict ``response_format`` (chat models); with ``extensions``,
        the other kinds as SGLang-style body fields."""
        if constraint.kind not in self.capabilities.constraints:
            raise UnsupportedError(f"OpenAI ({self.model_name}) cannot enforce {constraint.kind!r} "
                                   "natively; validate-and-retry applies")
        if constraint.kind == "tools":
            req.update(openai_tools(constraint.value))
            return
        if constraint.kind == "json_schema" and self.is_chat_model:
            schema = as_schema(constraint.value)
            req["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "output", "schema": schema, "strict": True}}
            return
        value = constraint.value
        req.setdefault("extra_body", {})[constraint.kind] = (
            value if isinstance(value, str) else json.dumps(value))

    def _messages(self, ctx: Context) -> list[dict[str, Any]]:
        messages = chat_messages(ctx)
        if ctx.open_role == "assistant" and messages and messages[-1].role == "assistant":
            if messages[-1].content:
                raise UnsupportedError("OpenAI chat models cannot continue a partly written "
                                       "assistant turn")
            messages = messages[:-1]
        out = []
        for m in messages:
            if m.images:
                parts: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
                parts += [{"type": "image_url", "image_url": {"url": data_url(i)}} for i in m.images]
                out.append({"role": m.role, "content": parts})
            else:
                out.append({"role": m.role, "content": m.content})
        return out

    async def _create(self, req: dict[str, Any]) -> Any:
        client = self._clients.get()
        endpoint = client.chat.completions if self.is_chat_model else client.completions
        try:
            return await endpoint.create(**req)
        except self._openai.APIError as exc:
            raise backend_error(self.name, exc) from exc

    # ---- Backend API ------------------------------------------------------------------------

    async def generate(self, ctx: Context, params: SamplingParams,
                       constraint: Constraint | None = None) -> list[GenResult]:
        resp = await self._create(self._request(ctx, params, constraint))
        usage = _usage(resp.usage)
        n = max(len(resp.choices), 1)
        results = []
        for i, choice in enumerate(sorted(resp.choices, key=lambda c: c.index)):
            text = choice.message.content if self.is_chat_model else choice.text
            share = usage["completion_tokens"] // n + (usage["completion_tokens"] % n if i == 0 else 0)
            meta = {**usage, "completion_tokens": share, "usage": usage, "id": resp.id,
                    "model": resp.model, "finish_reason": finish_reason(choice.finish_reason)}
            if self.is_chat_model and getattr(choice.message, "tool_calls", None):
                meta["tool_calls"] = openai_calls(choice.message)
            if choice.logprobs is not None:
                meta["output_token_logprobs"] = _output_logprobs(choice.logprobs, self.is_chat_model)
            results.append(GenResult(text=text or "", meta_info=meta))
        return results

    async def stream(self, ctx: Context, params: SamplingParams,
                     constraint: Constraint | None = None) -> AsyncIterator[StreamChunk]:
        if (params.n or 1) > 1:
            raise UnsupportedError("OpenAI backend streams one completion at a time (n=1)")
        req = self._request(ctx, params, constraint)
        req.update(stream=True, stream_options={"include_usage": True})
        stream = await self._create(req)
        reason: Any = None
        usage = _usage(None)
        try:
            async for chunk in stream:
                if chunk.usage is not None:
                    usage = _usage(chunk.usage)
                for choice in chunk.choices:
                    delta = choice.delta.content if self.is_chat_model else choice.text
                    reason = choice.finish_reason or reason
                    if delta:
                        yield StreamChunk(text=delta)
        except self._openai.APIError as exc:
            raise backend_error(self.name, exc) from exc
        finally:  # on cancel or early close this drops the HTTP response: the server aborts
            await stream.close()
        yield StreamChunk(text="", done=True,
                          meta_info={**usage, "finish_reason": finish_reason(reason)})

    async def select(self, ctx: Context, choices: Sequence[str], temperature: float,
                     choices_method: Any) -> SelectResult:
        if not self.is_chat_model:
            return await super().select(ctx, choices, temperature, choices_method)
        params = SamplingParams(max_tokens=32 + max(len(c) for c in choices) * 2,
                                temperature=temperature)
        constraint = Constraint(kind="json_schema", value=choice_schema(choices))
        result = (await self.generate(ctx, params, constraint))[0]
        index = parse_choice(result.text, list(choices), self.name)
        return SelectResult(index=index, meta_info=dict(result.meta_info))

    async def score_choices(self, ctx: Context, choices: Sequence[str],
                            unconditional: bool = False) -> ChoiceScores:
        if self.is_chat_model or unconditional:
            raise UnsupportedError(f"OpenAI ({self.model_name}) cannot score choices "
                                   + ("without context" if unconditional else "by prompt logprobs"))
        resp = await self._create({"model": self.model_name, "prompt": [ctx.text + c for c in choices],
                                   "max_tokens": 0, "echo": True, "logprobs": 0, "temperature": 0})
        rows: list[tuple[float, ...]] = [()] * len(choices)
        for choice in resp.choices:
            if choices[choice.index]:
                rows[choice.index] = _choice_logprobs(choice.logprobs, len(ctx.text))
        return ChoiceScores(token_logprobs=tuple(rows), meta_info=_usage(resp.usage))

    async def close(self) -> None:
        await self._clients.aclose_current()


def _usage(usage: Any) -> dict[str, Any]:
    details = getattr(usage, "prompt_tokens_details", None)
    return {"prompt_tokens": getattr(usage, "prompt_tokens", 0) or 0,
            "completion_tokens": getattr(usage, "completion_tokens", 0) or 0,
            "cached_tokens": getattr(details, "cached_tokens", 0) or 0}


def _output_logprobs(logprobs: Any, chat: bool) -> list[list[Any]]:
    """SGLang-shaped ``[[logprob, token_id(None), token_text], ...]``."""
    if chat:
        return [[t.logprob, None, t.token] for t in (logprobs.content or [])]
    return [[lp, None, tok] for lp, tok in zip(logprobs.token_logprobs, logprobs.tokens)]


def _choice_logprobs(logprobs: Any, boundary: int) -> tuple[float, ...]:
    """Logprobs of the echoed tokens from the one that covers character ``boundary`` (the
    first token not wholly inside the context) to the end."""
    offsets = list(logprobs.text_offset)
    last = max((j for j, off in enumerate(offsets) if off <= boundary), default=0)
    # tokens sharing one offset (byte pieces of one character) go together
    first = offsets.index(offsets[last]) if offsets else 0
    return tuple(lp for lp in logprobs.token_logprobs[first:] if lp is not None)
