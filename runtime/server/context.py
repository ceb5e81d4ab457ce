"""What every route needs: the engine, its client, the model's names and template, metrics."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from ..sampling_params import SamplingParams
from .args import ServerArgs
from .chat import ChatTemplate
from .engine_client import EngineClient
from .errors import APIError
from .metrics import ServerMetrics


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

    @classmethod
    def build(cls, engine: Any, args: ServerArgs) -> "ServerContext":
        info = engine.model_info
        path = str(info.get("model_path") or "")
        name = info.get("served_model_name") or os.path.basename(path.rstrip("/")) or "default"
        metrics = ServerMetrics(engine.stats)
        return cls(engine=engine, args=args, metrics=metrics,
                   client=EngineClient(engine, metrics),
                   chat_template=ChatTemplate.for_engine(engine), model_name=name,
                   model_path=path, context_length=int(info.get("context_length") or 0),
                   vocab_size=info.get("vocab_size"), created=int(time.time()))

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
        SamplingParams.from_dict(clean).validate(self.vocab_size)
        return clean

    def count_tokens(self, text: str) -> int:
        return len(self.engine.tokenizer.encode(text, add_special_tokens=False))

    def encode_chat(self, text: str) -> list[int]:
        """Token ids of a rendered chat prompt: its special tokens are already in the text."""
        return list(self.engine.tokenizer.encode(text, add_special_tokens=False))


def ctx(request: Request) -> ServerContext:
    return request.app.state.ctx
