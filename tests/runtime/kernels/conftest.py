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


def save_tiny_llama(path, hidden: int = 512, intermediate: int = 1376, heads: int = 8,
                    random_norms: bool = True):
    """A 3-layer random Llama (GQA, 2 KV heads of 64, vocab 1000) saved at ``path`` as a HF
    checkpoint; returns the HF model. Weights at 0.08, larger than HF's init, for a peaked,
    tie-free argmax; ``random_norms``: norm weights in [0.5, 1.5] instead of ones."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=3,
                      num_attention_heads=heads, num_key_value_heads=2, head_dim=64,
                      vocab_size=1000, max_position_embeddings=1024, tie_word_embeddings=False,
                      eos_token_id=None, bos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.08)
            elif random_norms:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(path)
    return model


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    """``save_tiny_llama``'s defaults (hidden 512, 8:2 heads), norms random."""
    path = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_llama(path)
    return path


def graph_decode(path, forced: list[int] | None = None, dtype: str = "bfloat16"
                 ) -> tuple[list[int], list[torch.Tensor]]:
    """A 40-token prompt's extend, then 16 decode steps replayed from CUDA graphs, on the model
    at ``path``: the tokens out and every forward's logits (the extend's first). ``forced``: the
    tokens to feed back instead of the sampled ones (the same inputs as another run)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks" / "gpu"))
    from driver import Driver

    from sgdsl.runtime.config import EngineConfig
    from sgdsl.runtime.model.runner import ModelRunner

    runner = ModelRunner(EngineConfig(model=str(path), dtype=dtype, device="cuda",
                                      attention_backend="triton", max_total_tokens=2048,
                                      max_running_requests=4, cuda_graph_max_bs=4))
    assert runner.cuda_graph_runner is not None
    logits, forward = [], runner.forward
    # copies: a replayed graph's output is overwritten by the next replay
    runner.forward = lambda batch: logits.append(forward(batch).float().clone()) or logits[-1]
    d = Driver(runner)
    seq = d.new_seq(torch.randint(0, 1000, (40,), generator=torch.Generator().manual_seed(2))
                    .tolist())
    d.extend([seq])
    for i in range(16):
        d.decode([seq])
        if forced is not None:
            seq.tokens[-1] = seq.out[-1] = forced[i]
    return seq.out, logits
