"""CpuDecoder (the CPU decode fast path) against the module path on the same batches: logits
and the K/V it stores, for Llama (GQA), Qwen2 (qkv bias) and Qwen3 (q/k norms), with the
weights in one and in several column blocks, batch 1 and mixed-length batches."""
from __future__ import annotations

import pytest
import torch

from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.layers import cpu_kernels
from sgdsl.runtime.model.cpu_decoder import CpuDecoder
from sgdsl.runtime.model.runner import ModelRunner

from .driver import RunnerDriver
from .tiny import tiny_model

CASES = {"llama": ("llama", {}), "qwen2": ("qwen2", {"tie_word_embeddings": False}),
         "qwen3": ("qwen3", {"head_dim": 32})}
PROMPTS = [[5, 17, 200, 3, 99, 42, 7], [11, 12], list(range(1, 40))]


@pytest.fixture()
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


class BothPaths:
    """Runs every decode batch through the module path, then the fast path, and records the
    largest logits / stored-KV differences (the fast path's KV is what stays in the pool)."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner, self.decoder = runner, runner.cpu_decoder
        self.max_logits_diff = self.max_kv_diff = 0.0
        self.decode_batches = 0
        self._forward = runner.forward
        runner.forward = self.forward

    def forward(self, batch):
        if not batch.mode.is_decode:
            return self._forward(batch)
        pool, loc = self.runner.token_kv_pool, batch.out_cache_loc
        self.runner.cpu_decoder = None
        ref = self._forward(batch)
        ref_kv = torch.stack([b[loc] for b in pool.k_buffer + pool.v_buffer])
        self.runner.cpu_decoder = self.decoder
        fast = self._forward(batch)
        kv = torch.stack([b[loc] for b in pool.k_buffer + pool.v_buffer])
        self.max_kv_diff = max(self.max_kv_diff, float((kv - ref_kv).abs().max()))
        self.max_logits_diff = max(self.max_logits_diff, float((fast - ref).abs().max()))
        self.decode_batches += 1
        return fast


@pytest.mark.parametrize("case,threads,matvec", [
    ("llama", 1, "c"), ("llama", 2, "c"), ("llama", 2, "mkl"), ("qwen2", 2, "c"),
    ("qwen2", 1, "mkl"), ("qwen3", 2, "c"), ("qwen3", 1, "mkl")])
def test_fast_decode_matches_module_path(case, threads, matvec, tmp_path, restore_threads,
                                         monkeypatch):
    """``matvec``: single rows through the C kernel or MKL (chosen per CPU vendor otherwise)."""
    monkeypatch.setenv(cpu_kernels.MATVEC_ENV, matvec)
    kind, overrides = CASES[case]
    tiny_model(kind, tmp_path, **overrides)
    runner = ModelRunner(EngineConfig(model=str(tmp_path), device="cpu", max_total_tokens=256,
                                      max_running_requests=4, num_threads=threads))
    assert isinstance(runner.cpu_decoder, CpuDecoder)
    assert runner.cpu_decoder.use_matvec == (matvec == "c")
    assert (runner.model._cpu_kernels is not None) == (matvec == "c")  # logits row
    assert runner.cpu_decoder.layers[0].gate_up.splits == threads  # column blocks
    assert runner.cpu_decoder.threads == threads
    runner.cpu_decoder.parallel_min_keys = 0  # attention on the thread team even for few keys
    both, d = BothPaths(runner), RunnerDriver(runner)
    reqs = [d.new_request() for _ in PROMPTS]
    toks = d.extend(list(zip(reqs, PROMPTS))).argmax(-1).tolist()
    for _ in range(3):  # mixed lengths, then batch 1
        toks = d.decode(list(zip(reqs, toks))).argmax(-1).tolist()
    tok = toks[2]
    for _ in range(3):
        tok = int(d.decode([(reqs[2], tok)]).argmax())
    assert both.decode_batches == 6
    assert both.max_logits_diff < 1e-4, both.max_logits_diff
    assert both.max_kv_diff < 1e-5, both.max_kv_diff
    for r in reqs:
        d.release(r)
    assert runner.token_kv_pool.available() == runner.max_total_tokens


def test_not_used_where_it_does_not_fit(tmp_path):
    tiny_model("llama", tmp_path)
    bf16 = ModelRunner(EngineConfig(model=str(tmp_path), device="cpu", dtype="bfloat16",
                                    max_total_tokens=64, max_running_requests=2))
    assert bf16.cpu_decoder is None
    d = RunnerDriver(bf16)
    req = d.new_request()
    tok = int(d.extend([(req, [1, 2, 3])]).argmax())
    assert torch.isfinite(d.decode([(req, tok)])).all()  # the module path serves decode
