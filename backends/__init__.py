"""Where sgdsl programs run. Imported lazily: ``import sgdsl.backends`` loads only the interface;
``openai``, ``anthropic`` and torch are imported when a backend of that kind is constructed."""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Local": ".local", "RuntimeEndpoint": ".runtime_endpoint", "Runtime": ".runtime",
    "OpenAI": ".openai", "Anthropic": ".anthropic",
    "Backend": ".base", "BackendError": ".base", "Capabilities": ".base", "ChoiceScores": ".base",
    "Context": ".base", "GenResult": ".base", "ImageData": ".base", "Message": ".base",
    "SelectResult": ".base", "StreamChunk": ".base", "UnsupportedError": ".base",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
