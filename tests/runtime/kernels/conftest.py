"""Kernel tests run compiled on CUDA, or under Triton's interpreter on a CPU-only machine.

NOTE: TRITON_INTERPRET must be set before any kernel module is imported (``triton.jit`` reads
it when it decorates), so it is set here, at collection time, before the test modules import.
"""
from __future__ import annotations

import os

import pytest
import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def device() -> str:
    return "cuda" if ON_GPU else "cpu"


@pytest.fixture(scope="session")
def dtype() -> torch.dtype:
    # The interpreter computes in numpy, which has no bf16; the GPU checks bf16.
    return torch.bfloat16 if ON_GPU else torch.float32


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64."""
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all(), "non-finite output"
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def tol(dtype: torch.dtype) -> float:
    return 2e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-4
