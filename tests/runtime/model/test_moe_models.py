"""Tiny random Qwen3-MoE (sparse and dense layers mixed, renormalized top-k) and Mixtral
(block_sparse_moe / w1 w2 w3 names): saved by HF, loaded by our loader, logits compared with HF
on the parity scenario; the MoE layer against a per-expert loop."""
from __future__ import annotations

import pytest
import torch

from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.layers.moe.layer import FusedMoE
from sgdsl.runtime.model.runner import ModelRunner

from .parity import run_parity
from .tiny import tiny_model

PROMPTS = [[5, 17, 200, 3, 99, 42, 7], [11, 12], [250, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]]
CASES = {
    "qwen3_moe": ("qwen3_moe", dict(head_dim=32, num_experts=8, num_experts_per_tok=3,
                                    moe_intermediate_size=48, norm_topk_prob=True,
                                    decoder_sparse_step=1, mlp_only_layers=[1])),
    "qwen3_moe_no_renorm": ("qwen3_moe", dict(num_experts=6, num_experts_per_tok=2,
                                              moe_intermediate_size=32, norm_topk_prob=False)),
    "mixtral": ("mixtral", dict(num_local_experts=4, num_experts_per_tok=2,
                                save_kwargs={"max_shard_size": "200KB"})),
}


@pytest.mark.parametrize("case", list(CASES))
def test_tiny_moe_matches_hf(case, tmp_path):
    kind, overrides = CASES[case]
    hf = tiny_model(kind, tmp_path, **overrides)
    runner = ModelRunner(EngineConfig(model=str(tmp_path), device="cpu", max_total_tokens=256,
                                      max_running_requests=4))
    mc = runner.model_config
    assert mc.architecture == type(hf).__name__ and mc.num_experts > 0
    moe = [m for m in runner.model.modules() if isinstance(m, FusedMoE)]
    assert len(moe) == len(mc.moe_layers) > 0
    result = run_parity(runner, hf, PROMPTS, decode_steps=3)
    assert result.max_abs_diff < 1e-3, result.max_abs_diff
    assert result.ours_greedy == result.hf_greedy
    runner.token_kv_pool.check_integrity()
    assert runner.token_kv_pool.available() == runner.max_total_tokens


def test_qwen3_moe_sparse_layers(tmp_path):
    tiny_model("qwen3_moe", tmp_path, num_hidden_layers=4, num_experts=4, num_experts_per_tok=2,
               moe_intermediate_size=32, decoder_sparse_step=2, mlp_only_layers=[3])
    from sgdsl.runtime.model.model_config import ModelConfig

    mc = ModelConfig.from_dir(tmp_path)
    assert mc.moe_layers == (1,)  # (i + 1) % 2 == 0 and not in mlp_only_layers
    assert mc.num_experts == 4 and mc.num_experts_per_tok == 2 and mc.moe_intermediate_size == 32


def test_dummy_expert_weights_under_tp_are_slices_of_tp1(monkeypatch):
    """load_format="dummy" at tp_size 2: each rank keeps its slice of the experts tp_size 1
    draws (gate and up rows of w13 split alike, w2 by columns), so dummy TP runs compute the
    same model as one GPU."""
    from types import SimpleNamespace

    import sgdsl.runtime.layers.moe.layer as moe_layer
    import sgdsl.runtime.model.loader as loader

    def build(rank: int, size: int) -> FusedMoE:
        group = SimpleNamespace(rank=rank, size=size)
        monkeypatch.setattr(moe_layer, "get_tp_group", lambda: group)
        monkeypatch.setattr(loader, "get_tp_group", lambda: group)
        layer = torch.nn.Sequential(FusedMoE(4, 2, 16, 24, renormalize=True,
                                             dtype=torch.float32, device="cpu"))
        loader.fill_dummy_weights(layer, seed=3)
        return layer[0]

    whole = build(0, 1)
    shards = [build(r, 2) for r in range(2)]
    gate = torch.cat([s.w13_weight[:, :12] for s in shards], 1)
    up = torch.cat([s.w13_weight[:, 12:] for s in shards], 1)
    assert torch.equal(torch.cat([gate, up], 1), whole.w13_weight)
    assert torch.equal(torch.cat([s.w2_weight for s in shards], 2), whole.w2_weight)
