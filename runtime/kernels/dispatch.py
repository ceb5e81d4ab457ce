"""Whether layers should run their fused Triton kernels for a tensor: on CUDA, when Triton
imports, unless ``SGDSL_DISABLE_TRITON_LAYERS=1`` (to compare against the plain torch ops).

Layers call ``use_triton(x)`` and import the kernel module lazily, so CPU-only installs never
import Triton."""
from __future__ import annotations

import functools
import os

import torch


@functools.lru_cache(maxsize=1)
def _available() -> bool:
    if os.environ.get("SGDSL_DISABLE_TRITON_LAYERS", "") in ("1", "true"):
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def use_triton(x: torch.Tensor) -> bool:
    return x.is_cuda and _available()
