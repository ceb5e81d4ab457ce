"""Expert parallelism on CPU (gloo, rank processes): tiny random Qwen3-MoE (8 experts, top-3,
renormalized, a sparse and a dense layer) and Mixtral (8 experts, top-2, w1/w2/w3 names,
sharded checkpoint) at EP=2 (TP=2), EP=4 (TP=4) and EP=2 over TP=4 (each expert split again
over 2 ranks), all-to-all dispatch, EP=2 over TP=4 in the all_reduce mode, and EP=2/EP=4 in
the auto mode with ep_a2a_min_tokens set (prefill over the all-to-all, decode and CUDA graphs'
graph-safe shapes over the all-reduce), decode greedily
token for token as EP=1 (TP=1) does (also in the padded all-to-all layout CUDA graphs use),
logits within 1e-4; each rank holds only its experts.
One FusedMoE layer's padded dispatch (the CUDA-graph layout), variable dispatch and
all_reduce mode equal the single-process product. Bad layouts fail with clear errors."""
from __future__ import annotations


import pytest
import torch

from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.errors import InvalidRequestError, ModelLoadError
from sgdsl.runtime.layers.moe.dispatch import DispatchPolicy, padded_layout
from sgdsl.runtime.layers.moe.layer import check_expert_split
from sgdsl.runtime.model.runner import ModelRunner

from .ep_worker import greedy, run_rank, runner_config
from .tp_worker import PROMPTS, model_test_module, tiny_model_dirs
from processes import free_port, run_ranks

RANKS = 4
EXPERTS = 8
# (tp_size, ep_size, ep_dispatch)
LAYOUTS = [(2, 2, "all_to_all"), (4, 4, "all_to_all"), (4, 2, "all_to_all"), (4, 2, "all_reduce"),
           (2, 2, "auto"), (4, 4, "auto")]
CASES = {
    "qwen3_moe": ("qwen3_moe", dict(head_dim=32, num_experts=EXPERTS, num_experts_per_tok=3,
                                    moe_intermediate_size=48, norm_topk_prob=True,
                                    decoder_sparse_step=1, mlp_only_layers=[1])),
    "mixtral": ("mixtral", dict(num_local_experts=EXPERTS, num_experts_per_tok=2,
                                save_kwargs={"max_shard_size": "200KB"})),
}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> list[str]:
    return tiny_model_dirs(tmp_path_factory, CASES)


def _run_ranks(model_dirs: list[str], device: str) -> list[tuple]:
    layouts = [(*layout, f"tcp://127.0.0.1:{free_port()}") for layout in LAYOUTS]
    want = sum(tp * (len(model_dirs) + 1) for tp, _, _ in LAYOUTS)
    return run_ranks(run_rank, lambda r, results: (r, layouts, model_dirs, PROMPTS, results,
                                                   device), RANKS, want)


def test_ep_equals_tp1_token_for_token(model_dirs):
    check_against_tp1(model_dirs, "cpu", atol=1e-4, rel=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < RANKS, reason=f"needs {RANKS} CUDA devices")
def test_ep_on_gpus_equals_tp1(model_dirs):
    """The same on 4 GPUs: NCCL all-to-alls, the padded layout captured in the decode CUDA
    graphs, the fused kernel skipping padding and other ranks' pairs (fp32, tf32 GEMMs)."""
    check_against_tp1(model_dirs, "cuda", atol=5e-2, rel=2e-2)


def check_against_tp1(model_dirs: list[str], device: str, atol: float, rel: float) -> None:
    got = _run_ranks(model_dirs, device)
    for model_dir in model_dirs:
        ref_tokens, ref_logits = greedy(ModelRunner(runner_config(model_dir, device)), PROMPTS)
        for layout in LAYOUTS:
            rows = [g[4:] for g in got if g[:4] == ("model", *layout) and g[5] == model_dir]
            assert sorted(r[0] for r in rows) == list(range(layout[0]))
            assert all(r[2] == EXPERTS // layout[1] for r in rows)  # each rank: its experts
            for r in rows:  # every rank decoded the same tokens as TP=1, in both layouts
                assert r[3] == ref_tokens and r[4] == ref_tokens, (model_dir, layout, r[0])
            logits = next(r[5] for r in rows if r[0] == 0)
            for a, b in zip(logits, ref_logits):
                torch.testing.assert_close(torch.from_numpy(a), b, rtol=0, atol=atol)
    for layout in LAYOUTS:
        checks = [g[5] for g in got if g[:4] == ("layer", *layout)]
        assert len(checks) == layout[0]
        for diffs in checks:
            assert max(diffs.values()) < rel, (layout, diffs)


def test_auto_policy_paths():
    """auto: the all-reduce (default: always); with ep_a2a_min_tokens, the variable all-to-all
    for eager batches from that size on, never in CUDA graphs (nor their warm-up:
    padded_layout); the forced modes stay forced."""
    small, large = torch.zeros(7, 4), torch.zeros(8, 4)
    auto, hybrid = DispatchPolicy("auto"), DispatchPolicy("auto", 8)
    assert (auto.path(small), auto.path(large)) == ("all_reduce", "all_reduce")
    assert (hybrid.path(small), hybrid.path(large)) == ("all_reduce", "variable")
    a2a, ar = DispatchPolicy("all_to_all", 8), DispatchPolicy("all_reduce", 8)
    assert (a2a.path(small), ar.path(large)) == ("variable", "all_reduce")
    with padded_layout():
        assert (hybrid.path(large), a2a.path(small), ar.path(large)) == (
            "all_reduce", "padded", "all_reduce")
    config = EngineConfig(model="x")
    assert (config.ep_dispatch, config.ep_a2a_min_tokens) == ("auto", None)
    with pytest.raises(InvalidRequestError, match="ep_a2a_min_tokens"):
        EngineConfig(model="x", ep_a2a_min_tokens=0)


def test_bad_layouts_fail_clearly(model_dirs, tmp_path):
    with pytest.raises(InvalidRequestError, match="ep_size=3.*must divide tp_size=4"):
        EngineConfig(model="x", tp_size=4, ep_size=3)
    with pytest.raises(InvalidRequestError, match="ep_size=0"):
        EngineConfig(model="x", ep_size=0)
    with pytest.raises(ModelLoadError, match="does not divide the model's 8 experts"):
        check_expert_split(8, 3)
    with pytest.raises(ModelLoadError, match="no experts"):
        check_expert_split(0, 2)
    from sgdsl.runtime.distributed.launch import check_model

    check_model(EngineConfig(model=model_dirs[0], tp_size=4, ep_size=4))  # fine
    model_test_module("tiny").tiny_model("llama", tmp_path)  # dense: nothing to split
    with pytest.raises(ModelLoadError, match="ep_size=2: the model has no experts"):
        check_model(EngineConfig(model=str(tmp_path), tp_size=2, ep_size=2))
