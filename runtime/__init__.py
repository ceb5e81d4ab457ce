"""sgdsl's bundled LLM runtime. ``Engine``, ``EngineConfig`` and ``SamplingParams`` are loaded
lazily, so importing a light submodule (``sgdsl.runtime.errors``) does not pull in torch or zmq."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import EngineConfig
    from .engine import Engine
    from .sampling_params import SamplingParams

__all__ = ["Engine", "EngineConfig", "SamplingParams"]

_WHERE = {"Engine": ".engine", "EngineConfig": ".config", "SamplingParams": ".sampling_params"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
