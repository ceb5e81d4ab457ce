"""Pipeline parallelism at the model level on CPU (gloo, 4 rank processes): tiny random Llama
(5 layers: uneven stages 2 + 1 + 1 + 1; untied head, vocab 250) at PP=4 (middle stages receive
and send) and Qwen3-MoE (q/k norms, experts in 3 of 4 layers) at PP=2 x TP=2 x EP=2 (an EP
group inside each stage) decode greedily token for token as PP=1 does, rank 0's logits within
1e-4; each stage's KV pool holds its layers only. Bad layouts fail with clear errors.
(PP=2, PP=2 x TP=2 over the scheduler, the tied embedding: test_pp_engine.py.)"""
from __future__ import annotations


import pytest
import torch

from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.distributed.pipeline import check_architecture, layer_range
from sgdsl.runtime.distributed.pipeline_micro import plan_parts, split
from sgdsl.runtime.model.forward_batch import ForwardBatch, ForwardMode
from sgdsl.runtime.errors import InvalidRequestError, ModelLoadError
from sgdsl.runtime.model.runner import ModelRunner

from .ep_worker import greedy, runner_config
from .pp_worker import run_rank
from .tp_worker import model_test_module
from processes import free_port, run_ranks

RANKS = 4
# (pp_size, tp_size, ep_size)
LAYOUTS = [(4, 1, 1), (2, 2, 2)]
PROMPTS = [[5, 17, 200, 3, 99, 42, 7], [11, 12], [249, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]]
CASES = {  # the MoE model last (ep_size > 1 runs on it only)
    "llama": ("llama", dict(vocab_size=250, tie_word_embeddings=False, num_hidden_layers=5)),
    "qwen3_moe": ("qwen3_moe", dict(head_dim=32, num_experts=4, num_experts_per_tok=2,
                                    moe_intermediate_size=48, norm_topk_prob=True,
                                    decoder_sparse_step=1, mlp_only_layers=[1],
                                    num_hidden_layers=4)),
}
LAYERS = {"llama": 5, "qwen3_moe": 4}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, str]:
    dirs = {}
    for name, (kind, overrides) in CASES.items():
        path = tmp_path_factory.mktemp(name)
        model_test_module("tiny").tiny_model(kind, path, **dict(overrides))
        dirs[name] = str(path)
    return dirs


def _run_ranks(dirs: list[str], device: str) -> list[tuple]:
    layouts = [(*layout, f"tcp://127.0.0.1:{free_port()}") for layout in LAYOUTS]
    want = sum(pp * tp * (len(dirs) - 1 if ep == 1 else 1) for pp, tp, ep in LAYOUTS)
    return run_ranks(run_rank, lambda r, results: (r, layouts, dirs, PROMPTS, results, device),
                     RANKS, want)


def test_pp_equals_pp1_token_for_token(model_dirs):
    check_against_pp1(model_dirs, "cpu", atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < RANKS, reason=f"needs {RANKS} CUDA devices")
def test_pp_on_gpus_equals_pp1(model_dirs):
    """The same on 4 GPUs: NCCL send/recv between stages, the decode CUDA graphs of each stage
    (the received hidden states in their static input), fp32 with tf32 GEMMs."""
    check_against_pp1(model_dirs, "cuda", atol=5e-2)


def check_against_pp1(model_dirs: dict[str, str], device: str, atol: float) -> None:
    got = _run_ranks(list(model_dirs.values()), device)
    for name, model_dir in model_dirs.items():
        ref_tokens, ref_logits = greedy(ModelRunner(runner_config(model_dir, device)), PROMPTS)
        for pp, tp, ep in LAYOUTS:
            rows = [g[3:] for g in got if g[:3] == (pp, tp, ep) and g[4] == model_dir]
            if (ep > 1) != (name == "qwen3_moe"):
                continue  # the dense model at PP=4, the MoE model with EP
            assert sorted(r[0] for r in rows) == list(range(pp * tp)), (name, pp, tp, ep)
            for rank, _, stage, kv_layers, tokens, _ in rows:
                start, end = layer_range(LAYERS[name], pp, stage)
                assert kv_layers == end - start  # each stage: its layers' KV only
                assert stage == pp - 1 - rank // tp  # rank 0 on the last stage
                assert tokens == ref_tokens, (name, (pp, tp, ep), rank)
            logits = next(r[5] for r in rows if r[0] == 0)
            for a, b in zip(logits, ref_logits):
                torch.testing.assert_close(torch.from_numpy(a), b, rtol=0, atol=atol)


def test_layer_split():
    assert [layer_range(5, 2, s) for s in range(2)] == [(0, 3), (3, 5)]
    assert [layer_range(80, 2, s) for s in range(2)] == [(0, 40), (40, 80)]
    assert [layer_range(5, 4, s) for s in range(4)] == [(0, 2), (2, 3), (3, 4), (4, 5)]


def test_micro_batch_split():
    """Requests of 5, 1 and 7 new tokens (prompt logprobs on the first: rows 1-4), 2 parts."""
    ids = torch.arange(13)
    b = ForwardBatch(ForwardMode.EXTEND, 3, ids, ids, torch.tensor([7, 8, 9]),
                     torch.tensor([5, 3, 9]), ids + 100, torch.tensor([0, 2, 2]),
                     torch.tensor([5, 1, 7]), torch.tensor([0, 5, 6]),
                     logits_indices=torch.tensor([1, 2, 3, 4, 5, 12]), seq_lens_cpu=[5, 3, 9],
                     extend_prefix_lens_cpu=[0, 2, 2], extend_seq_lens_cpu=[5, 1, 7])
    assert plan_parts(b, 2, 7) == [(0, 3)]  # 13 tokens: no two parts of 7
    ranges = plan_parts(b, 2, 4)
    assert ranges == [(0, 2), (2, 3)]
    first, second = split(b, ranges)
    assert first.input_ids.tolist() == list(range(6)) and second.input_ids.tolist() == list(range(6, 13))
    assert first.logits_indices.tolist() == [1, 2, 3, 4, 5] and second.logits_indices.tolist() == [6]
    assert second.extend_start_loc.tolist() == [0] and second.out_cache_loc[0] == 106
    assert second.req_pool_indices.tolist() == [9] and second.seq_lens_cpu == [9]


def test_bad_layouts_fail_clearly(model_dirs):
    from sgdsl.runtime.distributed.launch import check_model

    with pytest.raises(InvalidRequestError, match="pp_size=0: must be >= 1"):
        EngineConfig(model="x", pp_size=0)
    with pytest.raises(InvalidRequestError, match="tp_size x pp_size must be a multiple of "
                                                  "nnodes=2"):
        EngineConfig(model="x", tp_size=1, pp_size=3, nnodes=2, dist_init_addr="h:1")
    with pytest.raises(InvalidRequestError, match="pp_micro_batches=0: must be >= 1"):
        EngineConfig(model="x", pp_size=2, pp_micro_batches=0)
    with pytest.raises(InvalidRequestError, match="pp_size=2: speculative decoding does not run"):
        EngineConfig(model="x", pp_size=2, speculative_algorithm="ngram")
    with pytest.raises(ModelLoadError, match="pp_size=2: LlavaForConditionalGeneration does "
                                             "not run over pipeline stages"):
        check_architecture("LlavaForConditionalGeneration", 2)
    check_model(EngineConfig(model=model_dirs["llama"], pp_size=5))  # one layer a stage: fine
    with pytest.raises(ModelLoadError, match="pp_size=6 exceeds the model's 5 layers"):
        check_model(EngineConfig(model=model_dirs["llama"], pp_size=6))
