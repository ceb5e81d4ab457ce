"""``SrtBackend``: what ``Local`` and ``RuntimeEndpoint`` share. Both speak the runtime's
SGLang-native ``generate`` request (a dict: text/input_ids, sampling_params, logprob options,
stream, rid); they differ only in transport (an in-process Engine vs HTTP), which subclasses
provide through ``_call``, ``_call_stream``, ``_abort``, ``model_info`` and ``server_info``.

Select scoring (``score_choices``) follows SGLang's prompt-logprob method with exact token
boundaries: the context is prefilled once (warming the prefix cache and giving its token count
P), then the context and every context+choice are scored from position ``P - _TAIL`` in one
batch; comparing token ids finds where each joined text first leaves the context's tokens (a
choice may merge with the context's last token), and the choice is scored from there.
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import uuid
from abc import abstractmethod
from typing import Any, AsyncIterator, Sequence

from sgdsl.ir import Constraint, SamplingParams

from ._common import data_url, finish_reason
from .stream_logprobs import StreamLogprobs
from .base import (Backend, Capabilities, ChoiceScores, Context, GenResult, StreamChunk,
                   UnsupportedError)

_SAMPLING_FIELDS = {  # sgdsl.ir name -> runtime sampling_params name
    "max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens", "n": "n", "stop": "stop",
    "stop_token_ids": "stop_token_ids", "stop_regex": "stop_regex", "temperature": "temperature", "top_p": "top_p",
    "top_k": "top_k", "min_p": "min_p", "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty", "ignore_eos": "ignore_eos", "seed": "seed",
}
_REQUEST_FIELDS = ("return_logprob", "logprob_start_len", "top_logprobs_num",
                   "return_text_in_logprobs")
_NATIVE_CONSTRAINTS = frozenset({"regex", "json_schema", "ebnf"})
# Request ids: a per-process random prefix and a counter (uuid4 per request costs an urandom
# syscall, a measurable share of a small program's time in run_batch).
_RID_PREFIX = uuid.uuid4().hex[:16]
_RID_COUNTER = itertools.count()


def new_rid() -> str:
    return f"{_RID_PREFIX}-{next(_RID_COUNTER)}"


# Tokens of the context re-scored before the choice: BPE merges across the boundary only touch
# the context's last pre-token, so a few tokens always cover it (a fallback handles the rest).
_TAIL = 8


def build_request(text: str, params: SamplingParams, constraint: Constraint | None,
                  name: str) -> dict[str, Any]:
    """The runtime ``generate`` request for one completion of ``text``."""
    sampling = {_SAMPLING_FIELDS[k]: v for k, v in params.to_dict().items() if k in _SAMPLING_FIELDS}
    for key in ("stop", "stop_token_ids", "stop_regex"):
        if key in sampling:
            sampling[key] = list(sampling[key])
    if constraint is not None:
        if constraint.kind not in _NATIVE_CONSTRAINTS:
            raise UnsupportedError(f"{name} enforces regex, json_schema and ebnf natively, "
                                   f"not {constraint.kind!r} (lower it first)")
        value = constraint.value
        if constraint.kind == "json_schema" and not isinstance(value, str):
            value = json.dumps(value)
        sampling[constraint.kind] = value
    request: dict[str, Any] = {"text": text, "sampling_params": sampling}
    for key in _REQUEST_FIELDS:
        value = getattr(params, key)
        if value is not None:
            request[key] = value
    return request


def with_images(request: dict[str, Any], images: list[str] | None) -> dict[str, Any]:
    """The request with the prompt's images (``image_data``, SGLang's field), if any."""
    if images:
        request["image_data"] = images
    return request


def result_of(out: dict[str, Any], json_schema: bool = False) -> GenResult:
    """A runtime output dict as a ``GenResult`` (meta_info passed through, keys guaranteed);
    ``json_schema``: the request carried one (see ``schema_checked``)."""
    meta = dict(out.get("meta_info") or {})
    checked = json_schema and schema_checked(meta)
    meta.setdefault("prompt_tokens", 0)
    meta.setdefault("completion_tokens", len(out.get("output_ids") or ()))
    meta.setdefault("cached_tokens", 0)
    if meta.get("finish_reason") is None:
        meta["finish_reason"] = finish_reason("stop")
    return GenResult(text=out.get("text", ""), meta_info=meta, schema_checked=checked)


def schema_checked(meta: dict[str, Any]) -> bool:
    """Whether the sgdsl runtime validated this json_schema output against the request's
    original schema: its backstop (``runtime/tokenizer/req_state.py``) checks every output the
    grammar ended (finish ``stop`` on a token, not a stop string, not ``length``) and fails the
    request on a violation. ``forced_token_positions`` is in the meta_info of every constrained
    output of the sgdsl runtime, and of no SGLang server's, whose outputs get checked here.
    NOTE: validating again in the interpreter cost ~0.2 ms a program after the batch's answers
    came back (jsonschema), the constrained ``run_batch``'s main client-side cost."""
    fr = meta.get("finish_reason")
    return ("forced_token_positions" in meta and isinstance(fr, dict)
            and fr.get("type") == "stop" and not isinstance(fr.get("matched"), str))


class SrtBackend(Backend):
    """Shared logic of the runtime backends; see the module docstring."""

    name = "runtime"

    def _init_capabilities(self) -> None:
        info = self.server_info()
        grammar = info.get("grammar_backend", "xgrammar")
        # images: a vision-language model says how a prompt marks an image (model_info)
        self._image_placeholder = self.model_info.get("image_placeholder")
        self.capabilities = Capabilities(
            constraints=frozenset() if grammar == "none" else _NATIVE_CONSTRAINTS | {"tools"},
            prompt_logprobs=True, output_logprobs=True, native_n=True, partial_assistant=True,
            stop_regex=True, images=bool(self._image_placeholder),
            max_images=self.model_info.get("max_images_per_request") or None)
        self._template: Any = None

    # ---- transport (subclasses) -----------------------------------------------------------

    @abstractmethod
    async def _call(self, request: dict[str, Any]) -> dict | list[dict]:
        """Run one non-streaming generate request."""

    @abstractmethod
    def _call_stream(self, request: dict[str, Any]) -> AsyncIterator[dict]:
        """Run one streaming generate request, yielding the runtime's chunk dicts."""

    @abstractmethod
    async def _abort(self, rid: str) -> None:
        """Abort request ``rid``; must not raise."""

    @property
    @abstractmethod
    def model_info(self) -> dict[str, Any]:
        """The runtime's model_info (context_length, eos_token_ids, chat_template...)."""

    @abstractmethod
    def server_info(self) -> dict[str, Any]:
        """The runtime's server_info (config and live stats)."""

    # ---- Backend API --------------------------------------------------------------------------

    def chat_template(self) -> Any | None:
        """The model's own Jinja template (model_info ``chat_template``), else a guess by name."""
        if self._template is None:
            from sgdsl.chat_template import ChatTemplate, guess_chat_template

            info = self.model_info
            source = info.get("chat_template")
            self._template = (ChatTemplate.from_jinja(source, name=self.get_model_name())
                              if source else guess_chat_template(self.get_model_name()))
            if self._image_placeholder:  # an image is written as the model's placeholder
                self._template = dataclasses.replace(self._template,
                                                     image_token=self._image_placeholder)
        return self._template

    def get_model_name(self) -> str:
        info = self.model_info
        return str(info.get("served_model_name") or info.get("model_path") or "")

    async def generate(self, ctx: Context, params: SamplingParams,
                       constraint: Constraint | None = None) -> list[GenResult]:
        images = self._check_images(ctx)
        if constraint is not None and constraint.kind == "tools":
            from .srt_tools import generate_tools

            if images:
                raise UnsupportedError(f"{self.name}: tools in a program with images are not "
                                       "supported yet")
            return await generate_tools(self, ctx, params, constraint.value)
        request = with_images(build_request(ctx.text, params, constraint, self.name), images)
        out = await self._guarded(request)
        outs = out if isinstance(out, list) else [out]
        schema = constraint is not None and constraint.kind == "json_schema"
        return [result_of(o, schema) for o in outs]

    async def stream(self, ctx: Context, params: SamplingParams,
                     constraint: Constraint | None = None) -> AsyncIterator[StreamChunk]:
        images = self._check_images(ctx)
        if (params.n or 1) > 1:
            raise UnsupportedError(f"{self.name} streams one completion at a time (n=1)")
        request = with_images(build_request(ctx.text, params, constraint, self.name), images)
        request["stream"] = True
        rid = request["rid"] = new_rid()
        finished, seen, logprobs = False, "", StreamLogprobs()
        try:
            async for chunk in self._call_stream(request):
                text = chunk.get("text", "")
                delta = chunk["delta"] if "delta" in chunk else text[len(seen):]
                seen = text if "delta" not in chunk else seen + delta
                meta = chunk.get("meta_info") or {}
                if meta.get("finish_reason") is not None:
                    finished = True
                    full = {**chunk, "text": seen, "meta_info": logprobs.complete(meta)}
                    yield StreamChunk(text=delta, done=True, meta_info=result_of(full).meta_info)
                    return
                if delta:  # its meta_info: this chunk's logprob entries (SGLang's streamed)
                    yield StreamChunk(text=delta, meta_info=logprobs.chunk_meta(meta))
                else:  # no text: its logprob entries go with the next chunk
                    logprobs.add(meta)
        finally:
            if not finished:  # cancelled, closed early or failed: free the runtime's slot
                await self._abort(rid)

    async def cache_prefix(self, ctx: Context) -> None:
        if ctx.text:
            await self._guarded(with_images({"text": ctx.text, "sampling_params": {
                "max_new_tokens": 0}}, self._check_images(ctx)))

    async def score_choices(self, ctx: Context, choices: Sequence[str],
                            unconditional: bool = False) -> ChoiceScores:
        images = self._check_images(ctx)
        prompt_len = 0
        if ctx.text:  # warm the cache with the context; its length places the scoring window
            first = await self._guarded(with_images(
                {"text": ctx.text, "sampling_params": {"max_new_tokens": 0}}, images))
            prompt_len = int(first["meta_info"]["prompt_tokens"])
        start = max(prompt_len - _TAIL, 0)
        entries = await self._choice_entries(ctx.text, choices, start, images)
        if start > 0 and any(d == 0 for d, _ in entries):  # diverged before the window: rescore
            entries = await self._choice_entries(ctx.text, choices, 0, images)
        token_logprobs = tuple(tuple(lp for lp, _ in tokens[d:] if lp is not None)
                               for d, tokens in entries)
        meta: dict[str, Any] = {"prompt_tokens": prompt_len, "choice_tokens": [
            [tid for _, tid in tokens[d:]] for d, tokens in entries]}
        uncond = None
        if unconditional:
            uncond = await self._unconditional(meta["choice_tokens"])
        return ChoiceScores(token_logprobs=token_logprobs, unconditional_logprobs=uncond,
                            meta_info=meta)

    # ---- helpers ------------------------------------------------------------------------------

    async def _choice_entries(self, text: str, choices: Sequence[str], start: int,
                              images: list[str] | None = None
                              ) -> list[tuple[int, list[tuple[float | None, int]]]]:
        """Per choice: (index of the first token past the context's tokens, [(logprob, id)])
        over the prompt positions from ``start``."""
        texts = ([text] if text else []) + [text + c for c in choices]
        request = {"text": texts, "sampling_params": {"max_new_tokens": 0, "temperature": 0.0},
                   "return_logprob": True, "logprob_start_len": start}
        if images:  # every scored text holds the context's images
            request["image_data"] = [images] * len(texts)
        outs = await self._guarded(request)
        rows = [[(e[0], int(e[1])) for e in o["meta_info"]["input_token_logprobs"]] for o in outs]
        ctx_ids = [tid for _, tid in rows[0]] if text else []
        result = []
        for row in rows[1:] if text else rows:
            d = 0
            while d < len(ctx_ids) and d < len(row) and row[d][1] == ctx_ids[d]:
                d += 1
            result.append((d, row))
        return result

    async def _unconditional(self, token_rows: list[list[int]]) -> tuple[tuple[float, ...], ...]:
        """Logprobs of each choice's tokens after only an end-of-text token (no context), so
        the first choice token gets a logprob too."""
        eos = (self.model_info.get("eos_token_ids") or [0])[0]
        rows = [r for r in token_rows if r]
        outs = await self._guarded({
            "input_ids": [[eos, *r] for r in rows], "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True, "logprob_start_len": 0}) if rows else []
        scored = iter(outs)
        result = []
        for r in token_rows:
            if not r:
                result.append(())
                continue
            entries = next(scored)["meta_info"]["input_token_logprobs"][1:]
            result.append(tuple(float(e[0]) for e in entries))
        return tuple(result)

    async def _guarded(self, request: dict[str, Any]) -> Any:
        """``_call`` with a request id, aborting the runtime request if the caller cancels."""
        texts = request.get("text", request.get("input_ids"))
        batch = isinstance(texts, list) and texts and not isinstance(texts[0], int)
        rid = new_rid()
        request["rid"] = [f"{rid}-{i}" for i in range(len(texts))] if batch else rid
        try:
            return await self._call(request)
        except asyncio.CancelledError:
            for r in request["rid"] if batch else [rid]:
                await self._abort(r)
            raise

    def _check_images(self, ctx: Context) -> list[str] | None:
        """The context's images as data: URLs, in prompt order (None: no images); a text-only
        model refuses them."""
        if not (ctx.images or any(m.images for m in ctx.messages)):
            return None
        if not self._image_placeholder:
            raise UnsupportedError(f"{self.name}: the model {self.get_model_name()!r} takes no images")
        return [data_url(image) for image in ctx.images]

    def flush_cache(self) -> bool:
        raise NotImplementedError

    def get_server_info(self) -> dict[str, Any]:
        return self.server_info()
