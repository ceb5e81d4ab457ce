"""Reading one rank's slice of a checkpoint tensor, which is either a torch tensor or a lazy
safetensors view (``safe_open(...).get_slice(name)``: only the indexed bytes are read)."""
from __future__ import annotations

from typing import Any

import torch

from ..errors import ModelLoadError


def is_lazy(t: Any) -> bool:
    return not isinstance(t, torch.Tensor) and hasattr(t, "get_shape")


def shape_of(t: Any) -> tuple[int, ...]:
    return tuple(t.get_shape()) if is_lazy(t) else tuple(t.shape)


def narrow(t: Any, dim: int, start: int, size: int) -> Any:
    """``t[..., start:start + size, ...]`` along ``dim``; a lazy view reads only those bytes."""
    if is_lazy(t):
        index = (slice(None),) * dim + (slice(start, start + size),)
        return t[index]
    return t.narrow(dim, start, size)


def materialize(t: Any) -> torch.Tensor:
    return t[...] if is_lazy(t) else t  # NOTE: [...] also reads 0-d tensors (scalar scales)


def copy_checked(dst: torch.Tensor, src: Any, what: str) -> None:
    """``dst.copy_(src)`` after checking the shapes match (names ``what`` otherwise)."""
    if shape_of(src) != tuple(dst.shape):
        raise ModelLoadError(f"{what}: checkpoint shape {shape_of(src)} != model shape "
                             f"{tuple(dst.shape)}")
    dst.copy_(materialize(src))
