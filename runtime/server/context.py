"""What every route needs: the engine, its client, the model's names and template, metrics."""
from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from fastapi import Request

from ..function_call import ToolCallFormat, detect_format, get_format, template_supports_tools
from ..params_key import params_key
from ..sampling_params import SamplingParams
from ..tokenizer.encoder import ids_batch_encoder, ids_encoder
from .args import ServerArgs
from .chat import ChatTemplate
from .encode_batcher import EncodeBatcher
from .engine_client import EngineClient
from .errors import APIError
from .metrics import ServerMetrics
from .reasoning import ReasoningFormat, get_reasoning_format

# A prompt at least this long is encoded on a worker thread, not on the event loop: the Rust
# encode lets go of the GIL and costs ~3 us a token (Llama-3's tokenizer; ~0.9 ms for a
# 300-token prompt on the dev box), where the hop costs tens of us. Each chat request's encode
# then runs beside the loop's parsing of the next requests and the Engine's thread.
OFFLOAD_ENCODE_CHARS = 1024
CHECKED_MAX = 1024  # distinct validated sampling dicts kept (then forgotten, all at once)


@dataclass(frozen=True)
class ServerContext:
    """Built once per app; routes get it with ``ctx(request)``."""

    engine: Any
    args: ServerArgs
    metrics: ServerMetrics
    client: EngineClient
    chat_template: ChatTemplate
    model_name: str
    model_path: str
    context_length: int
    vocab_size: int | None
    created: int
    tool_format: ToolCallFormat
    reasoning: ReasoningFormat | None = None
    encode: Callable[[str], list[int]] | None = None  # text -> ids, no special tokens added
    batcher: EncodeBatcher | None = None  # long prompts of one loop turn, encoded together
    # sampling dicts already validated (their hashable form): see ``sampling``
    checked: dict[tuple, None] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(cls, engine: Any, args: ServerArgs) -> "ServerContext":
        info = engine.model_info
        tok = getattr(engine, "tokenizer", None)
        path = str(info.get("model_path") or "")
        name = info.get("served_model_name") or os.path.basename(path.rstrip("/")) or "default"
        metrics = ServerMetrics(engine.stats)
        template = ChatTemplate.for_engine(engine)
        return cls(engine=engine, args=args, metrics=metrics,
                   client=EngineClient(engine, metrics),
                   chat_template=template, model_name=name,
                   model_path=path, context_length=int(info.get("context_length") or 0),
                   vocab_size=info.get("vocab_size"), created=int(time.time()),
                   tool_format=_tool_format(args, template.source),
                   reasoning=get_reasoning_format(args.reasoning_parser),
                   encode=ids_encoder(tok),
                   batcher=None if tok is None else EncodeBatcher(
                       ids_batch_encoder(tok), getattr(engine, "hold_handoff", None)))

    def check_model(self, model: str | None) -> None:
        """Unknown model names are a 404, as with the hosted APIs. ``default`` (SGLang's
        convention) and the model path are accepted too."""
        if model is None or model in (self.model_name, self.model_path, "default"):
            return
        raise APIError(404, f"The model '{model}' does not exist; this server serves "
                            f"'{self.model_name}'", param="model", code="model_not_found")

    def sampling(self, params: dict[str, Any]) -> dict[str, Any]:
        """Validate runtime sampling params now (a 400 naming the field, before any engine
        work) and return them without null entries, which mean "default" in every protocol."""
        clean = {k: v for k, v in params.items() if v is not None}
        # NOTE: a burst's requests mostly share their params; validating each dict once saves
        # a SamplingParams build per request (the Engine still builds its own; issue 29).
        key = params_key(clean)
        if key is None or key not in self.checked:
            SamplingParams.from_dict(clean).validate(self.vocab_size)
            if key is not None:
                if len(self.checked) >= CHECKED_MAX:
                    self.checked.clear()
                self.checked[key] = None
        return clean

    def count_tokens(self, text: str) -> int:
        return len(self.encode_chat(text))

    def encode_chat(self, text: str) -> list[int]:
        """Token ids of a rendered chat prompt: its special tokens are already in the text.
        (The backend's encode where that gives the same ids: see ids_encoder.)"""
        if self.encode is None:
            return list(self.engine.tokenizer.encode(text, add_special_tokens=False))
        return self.encode(text)

    async def encode_chat_async(self, text: str) -> list[int]:
        """``encode_chat``, on a worker thread for a long prompt (see OFFLOAD_ENCODE_CHARS)."""
        if len(text) < OFFLOAD_ENCODE_CHARS:
            return self.encode_chat(text)
        if self.batcher is None:  # an engine without a tokenizer of its own
            return await asyncio.get_running_loop().run_in_executor(None, self.encode_chat, text)
        return await self.batcher.encode(text)


def _tool_format(args: ServerArgs, template_source: str) -> ToolCallFormat:
    """``--tool-call-parser``, else the template's family; a template without tool support
    gets the fallback prompt, whose format is Hermes (see tools.py)."""
    if args.tool_call_parser:
        return get_format(args.tool_call_parser)
    if template_supports_tools(template_source):
        return detect_format(template_source)
    return get_format("hermes")


def ctx(request: Request) -> ServerContext:
    return request.app.state.ctx
