"""ModelRunner: device/dtype resolution, KV sizing from the byte budget, clamps and errors,
and a forward on dummy weights at a Llama-3.1-shaped tiny config."""
from __future__ import annotations

import pytest
import torch

from sgdsl.runtime.cache.pool import TokenKVPool
from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.errors import ModelLoadError
from sgdsl.runtime.layers.attention.torch_native import TorchNativeAttnBackend
from sgdsl.runtime.model.runner import ModelRunner, resolve_dtype

from .driver import RunnerDriver
from .test_loader import TINY_LLAMA31
from .test_model_config import write_config


@pytest.fixture()
def tiny_dir(tmp_path):
    return write_config(tmp_path, TINY_LLAMA31)


def make(tiny_dir, **kw) -> ModelRunner:
    return ModelRunner(EngineConfig(model=str(tiny_dir), load_format="dummy", device="cpu", **kw))


def test_kv_sized_from_byte_budget(tiny_dir):
    per_token = TokenKVPool.bytes_per_token(2, 2, 16, torch.float32)
    runner = make(tiny_dir, kv_cache_bytes=per_token * 1000 + 7, max_running_requests=4)
    assert runner.max_total_tokens == 1000
    assert runner.token_kv_pool.size == 1000 and runner.token_kv_pool.dtype == torch.float32
    assert runner.context_len == 512
    assert runner.req_to_token_pool.req_to_token.shape == (4 + 8, 512)
    assert isinstance(runner.attn_backend, TorchNativeAttnBackend)


def test_kv_clamped_to_what_requests_can_use(tiny_dir):
    runner = make(tiny_dir, context_length=64, max_running_requests=2)
    assert runner.context_len == 64 and runner.max_total_tokens == 128


def test_explicit_total_tokens_and_dtype(tiny_dir):
    runner = make(tiny_dir, max_total_tokens=100, dtype="bfloat16", max_running_requests=4)
    assert runner.max_total_tokens == 100 and runner.dtype == torch.bfloat16
    assert runner.token_kv_pool.k_buffer[0].dtype == torch.bfloat16
    d = RunnerDriver(runner)
    logits = d.extend([(d.new_request(), [1, 2, 3])])
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()


def test_bad_sizes_raise(tiny_dir):
    with pytest.raises(ModelLoadError, match="context_length"):
        make(tiny_dir, context_length=100_000)
    with pytest.raises(ModelLoadError, match="KV cache too small"):
        make(tiny_dir, kv_cache_bytes=1000)
    with pytest.raises(ModelLoadError, match="attention backend"):
        make(tiny_dir, attention_backend="flash")  # type: ignore[arg-type]


def test_auto_resolution():
    cpu = torch.device("cpu")
    assert resolve_dtype("auto", cpu) == torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("float16", cpu) == torch.float16


def test_num_threads_applied(tiny_dir):
    before = torch.get_num_threads()
    try:
        make(tiny_dir, num_threads=1, max_total_tokens=64)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_dummy_forward_extend_then_decode(tiny_dir):
    runner = make(tiny_dir, max_total_tokens=64, max_running_requests=2)
    d = RunnerDriver(runner)
    a, b = d.new_request(), d.new_request()
    logits = d.extend([(a, [5, 6, 7, 8]), (b, [9])])
    assert logits.shape == (2, 300) and torch.isfinite(logits).all()
    logits = d.decode([(a, 1), (b, 2)])
    assert logits.shape == (2, 300)
    assert runner.token_kv_pool.available() == 64 - 7
    d.release(a), d.release(b)
    runner.token_kv_pool.check_integrity()
    assert runner.token_kv_pool.available() == 64


def test_cpu_weight_layout(tiny_dir):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        runner = make(tiny_dir, max_total_tokens=64)
    finally:
        torch.set_num_threads(before)
    layer = runner.model.model.layers[0]
    # [splits, in, out // splits]: column blocks of the transposed weight
    assert layer.self_attn.qkv_proj.weight.shape == (2, 64, (64 + 2 * 32) // 2)
    assert layer.mlp.down_proj.weight.shape == (2, 128, 32)
    assert runner.model.lm_head.weight.shape == (2, 64, 150)
    assert runner.model.model.embed_tokens.weight.shape == (300, 64)  # lookups stay row-major
    d = RunnerDriver(runner)
    logits = d.extend([(d.new_request(), [3, 4, 5])], logits_indices=[0, 1, 2])
    assert logits.shape == (3, 300) and torch.isfinite(logits).all()
