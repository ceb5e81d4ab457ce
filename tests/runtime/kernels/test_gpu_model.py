"""On the GPU: greedy outputs of the triton backend with CUDA graphs match the torch-native
backend and HF transformers token for token on a small random Llama (fp32), for a batch of
mixed lengths with chunked prefill and a shared-prefix (cache-hit) request."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from .conftest import save_tiny_llama

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks" / "gpu"))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    return path, save_tiny_llama(path, hidden=384, intermediate=688, heads=6, random_norms=False)


def _scenario(model_dir, backend: str, graphs: bool, dtype: str = "float32") -> list[list[int]]:
    from driver import Driver

    from sgdsl.runtime.config import EngineConfig
    from sgdsl.runtime.model.runner import ModelRunner

    runner = ModelRunner(EngineConfig(model=str(model_dir), dtype=dtype, device="cuda",
                                      attention_backend=backend, disable_cuda_graph=not graphs,
                                      max_total_tokens=4096, max_running_requests=16,
                                      cuda_graph_max_bs=16))
    assert (runner.cuda_graph_runner is not None) == graphs
    d = Driver(runner)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 1000, (n,), generator=gen).tolist() for n in (5, 37, 130, 100)]
    s = [d.new_seq(p) for p in prompts]
    d.extend(s[:2])
    pending = s[2:4]
    while pending:  # chunked prefill, 64 tokens per chunk; 130 and 100 finish apart
        done = d.extend(pending, chunk=64)
        pending = [x for x, t in zip(pending, done) if t is None]
    hit = d.new_seq(prompts[2][:48] + prompts[0], share_from=s[2], share=48)
    d.extend([hit])
    seqs = s + [hit]
    for _ in range(24):
        d.decode(seqs)
    return [x.out for x in seqs], [x.tokens[: len(x.tokens) - len(x.out)] for x in seqs]


def test_triton_graphs_match_torch_native_and_hf(tiny_dir):
    path, hf = tiny_dir
    ref, prompts = _scenario(path, "torch_native", graphs=False)
    assert all(len(o) == 25 for o in ref)
    ours, _ = _scenario(path, "triton", graphs=True)
    assert ours == ref
    hf = hf.cuda().eval()
    for prompt, out in zip(prompts, ours):
        ids = torch.tensor([prompt], device="cuda")
        gen = hf.generate(ids, max_new_tokens=25, do_sample=False, eos_token_id=None,
                          pad_token_id=0)
        assert gen[0, len(prompt):].tolist() == out
