"""The runner on CUDA (run on the GPU machine): tiny Llama/Qwen3 parity with HF in fp32 on the
GPU with the torch-native backend, and bf16 auto settings (dtype, KV sizing from free memory)."""
from __future__ import annotations

import pytest
import torch

from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.model.runner import ModelRunner

from .driver import RunnerDriver
from .parity import run_parity
from .test_tiny_parity import PROMPTS
from .tiny import tiny_model

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_cuda_fp32_parity(kind, tmp_path):
    hf = tiny_model(kind, tmp_path).cuda()
    runner = ModelRunner(EngineConfig(model=str(tmp_path), device="cuda", dtype="float32",
                                      attention_backend="torch_native", max_total_tokens=256,
                                      max_running_requests=4))
    assert runner.device.type == "cuda"

    class OnCuda:  # parity feeds CPU token ids; run HF on the GPU and return CPU logits
        def __call__(self, ids):
            out = hf(ids.cuda())
            out.logits = out.logits.cpu()
            return out

    result = run_parity(runner, OnCuda(), PROMPTS, decode_steps=3)
    assert result.max_abs_diff < 1e-3 and result.ours_greedy == result.hf_greedy


def test_cuda_auto_bf16_and_kv_from_free_memory(tmp_path):
    tiny_model("llama", tmp_path)
    runner = ModelRunner(EngineConfig(model=str(tmp_path), device="auto",
                                      mem_fraction_static=0.01, max_running_requests=4))
    assert runner.dtype == torch.bfloat16 and runner.token_kv_pool.k_buffer[0].is_cuda
    assert 16 <= runner.max_total_tokens <= runner.context_len * 4
    d = RunnerDriver(runner)
    a, b = d.new_request(), d.new_request()
    logits = d.extend([(a, [1, 2, 3, 4]), (b, [5, 6])])
    logits = d.decode([(a, int(logits[0].argmax())), (b, int(logits[1].argmax()))])
    assert logits.dtype == torch.float32 and logits.shape == (2, 256)
    assert torch.isfinite(logits).all()


# NOTE: CUDA graphs are captured for the triton backend only (torch_native runs eager).
@pytest.mark.parametrize("backend,graphs", [("triton", False), ("triton", True),
                                            ("torch_native", False)])
def test_cuda_qwen3_moe_fused_layers(backend, graphs, tmp_path):
    """Tiny Qwen3-MoE (a dense layer among the sparse ones) through the GPU layers: q/k norm,
    rotary and (triton backend) the KV store in one kernel, the experts' rows summed by the
    next add+RMSNorm; eager and CUDA graphs. fp32, but the MoE GEMMs run tf32: a looser bound."""
    hf = tiny_model("qwen3_moe", tmp_path, head_dim=32, num_experts=8, num_experts_per_tok=3,
                    moe_intermediate_size=48, norm_topk_prob=True, decoder_sparse_step=1,
                    mlp_only_layers=[1], weight_std=0.1).cuda()
    runner = ModelRunner(EngineConfig(model=str(tmp_path), device="cuda", dtype="float32",
                                      attention_backend=backend, disable_cuda_graph=not graphs,
                                      cuda_graph_max_bs=4, max_total_tokens=256,
                                      max_running_requests=4))

    class OnCuda:
        def __call__(self, ids):
            out = hf(ids.cuda())
            out.logits = out.logits.cpu()
            return out

    result = run_parity(runner, OnCuda(), PROMPTS, decode_steps=3)
    print("qwen3_moe gpu max abs diff", result.max_abs_diff)
    assert result.max_abs_diff < 5e-2 and result.ours_greedy == result.hf_greedy
