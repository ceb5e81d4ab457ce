"""Attention backend factory: ``create_attention_backend(name, runner)``.

``auto`` picks ``triton`` on CUDA when its module is importable, else ``torch_native``.
"""
from __future__ import annotations

import importlib
from typing import Any

from ...errors import ModelLoadError
from .base import AttentionBackend

# name -> (module under this package, class name)
_BACKENDS: dict[str, tuple[str, str]] = {
    "torch_native": ("torch_native", "TorchNativeAttnBackend"),
    "triton": ("triton", "TritonAttnBackend"),
}


def _load(name: str) -> type[AttentionBackend]:
    module, cls = _BACKENDS[name]
    return getattr(importlib.import_module(f"{__package__}.{module}"), cls)


def resolve_backend_name(name: str, device: Any) -> str:
    if name in _BACKENDS:
        return name
    if name != "auto":
        raise ModelLoadError(f"unknown attention backend {name!r}; "
                             f"supported: auto, {', '.join(_BACKENDS)}")
    if getattr(device, "type", str(device)) == "cuda":
        try:
            _load("triton")
            return "triton"
        except (ImportError, AttributeError):
            pass  # the GPU kernels are optional; the torch path works on CUDA too
    return "torch_native"


def create_attention_backend(name: str, runner: Any) -> AttentionBackend:
    """Build the backend for ``runner`` (needs ``.device``, ``.req_to_token_pool``,
    ``.token_kv_pool``; backends may read more, e.g. ``.model_config``)."""
    return _load(resolve_backend_name(name, runner.device))(runner)
