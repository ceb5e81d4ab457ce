"""The runtime's HTTP server: SGLang-native, OpenAI and Anthropic protocols over one Engine.

``create_app(engine, ServerArgs(...))`` builds the FastAPI app; ``cli.main(argv)`` is
``sgdsl serve``. Imports are lazy so that ``import sgdsl.runtime.server`` stays cheap.
"""
from __future__ import annotations

from typing import Any

__all__ = ["ServerArgs", "create_app", "main"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from .app import create_app

        return create_app
    if name == "ServerArgs":
        from .args import ServerArgs

        return ServerArgs
    if name == "main":
        from .cli import main

        return main
    raise AttributeError(name)
