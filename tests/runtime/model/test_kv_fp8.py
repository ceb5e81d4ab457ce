"""fp8 (E4M3) KV cache on the CPU path: the pool's store/read round trip with per-layer scales,
checkpoint scales reaching the pool, and a tiny model's logits with an fp8 cache against the
same model with an fp32 cache.

Tolerances (stated): round trip within E4M3's half-step (6.25% of the magnitude, times the
scale); logits within 5% relative (norm) error; greedy agreement (teacher-forced) >= 90%.
"""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from sgdsl.runtime.cache.pool import TokenKVPool
from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.errors import ModelLoadError
from sgdsl.runtime.model.runner import ModelRunner

from .test_fp8 import PROMPTS, _greedy, _logits_along, _rel
from .tiny import tiny_model


def test_pool_round_trip_with_scales():
    pool = TokenKVPool(8, 2, 2, 4, torch.float8_e4m3fn, "cpu")
    pool.set_scales({1: (0.25, 4.0)})
    k = torch.randn(3, 2, 4) * 3
    v = torch.randn(3, 2, 4) * 30
    loc = torch.tensor([5, 1, 7])
    pool.write(1, loc, k, v)
    assert pool.k_buffer[1].dtype == torch.float8_e4m3fn
    k2, v2 = pool.read(1, loc, torch.float32)
    assert bool(((k2 - k).abs() <= k.abs() * 0.0625 + 0.25 * 2 ** -9).all())
    assert bool(((v2 - v).abs() <= v.abs() * 0.0625 + 4.0 * 2 ** -9).all())
    # stored values are value / scale: v / 4 fits E4M3 (|v| <= ~150 here)
    assert torch.allclose(pool.v_buffer[1][loc].float() * 4.0, v2)
    with pytest.raises(ValueError, match="positive"):
        pool.set_scales({0: (0.0, 1.0)})
    bytes_fp8 = TokenKVPool.bytes_per_token(2, 2, 4, torch.float8_e4m3fn)
    assert bytes_fp8 * 4 == TokenKVPool.bytes_per_token(2, 2, 4, torch.float32)


def _runner(path, **kw) -> ModelRunner:
    return ModelRunner(EngineConfig(model=str(path), device="cpu", max_total_tokens=512,
                                    max_running_requests=4, **kw))


def test_fp8_kv_tracks_full_precision_cache(tmp_path):
    tiny_model("qwen3", tmp_path, head_dim=32, weight_std=0.08)
    ref, fp8 = _runner(tmp_path), _runner(tmp_path, kv_cache_dtype="fp8_e4m3")
    assert fp8.token_kv_pool.quantized and fp8.max_total_tokens == 512
    agree = total = 0
    for prompt in PROMPTS:
        seq = prompt + _greedy(ref, prompt, 10)
        # decode steps read the cache: compare the greedy decode paths' logits
        want = _logits_along(ref, seq, len(prompt) - 1)
        ids = _greedy(fp8, prompt, 10)
        got = _decode_logits(fp8, seq, len(prompt))
        assert _rel(got, want[1:]) < 0.05
        agree += int((got.argmax(-1) == want[1:].argmax(-1)).sum())
        total += got.shape[0]
        assert len(ids) == 10
    assert agree / total >= 0.9, (agree, total)
    fp8.token_kv_pool.check_integrity()
    assert fp8.token_kv_pool.available() == fp8.max_total_tokens


def _decode_logits(runner: ModelRunner, seq: list[int], prompt_len: int) -> torch.Tensor:
    """Prefill the prompt, then feed the rest of ``seq`` one decode step at a time (each step
    attends over fp8 cache entries); the logits of every decode step."""
    from .driver import RunnerDriver

    d = RunnerDriver(runner)
    req = d.new_request()
    d.extend([(req, seq[:prompt_len])])
    rows = [d.decode([(req, t)])[0].clone() for t in seq[prompt_len:]]
    d.release(req)
    return torch.stack(rows)


def test_checkpoint_kv_scales_reach_the_pool(tmp_path):
    tiny_model("llama", tmp_path)
    sd = load_file(str(tmp_path / "model.safetensors"))
    sd["model.layers.1.self_attn.k_scale"] = torch.tensor(0.5)
    sd["model.layers.1.self_attn.v_scale"] = torch.tensor([2.0])
    save_file(sd, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    runner = _runner(tmp_path, kv_cache_dtype="fp8_e4m3")
    pool = runner.token_kv_pool
    assert (pool.k_scale, pool.v_scale) == ([1.0, 0.5], [1.0, 2.0])


def test_bad_kv_cache_dtype_is_rejected(tmp_path):
    tiny_model("llama", tmp_path)
    with pytest.raises((ModelLoadError, ValueError)):
        _runner(tmp_path, kv_cache_dtype="int4")
