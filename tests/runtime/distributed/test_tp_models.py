"""Every architecture at TP=4 on CPU (gloo, 4 rank processes): tiny random Llama (vocab 250:
the last vocab block padded; untied head), Qwen2 (qkv bias, sharded checkpoint), Qwen3 (q/k
norm, head_dim 32, tied head), Qwen3-MoE and Mixtral (experts split by intermediate dim), each with 4 heads and 2 kv heads (so kv heads are replicated),
loaded from safetensors slice by slice: logits equal TP=1 within 1e-4 over an extend and
decode steps, and each rank's KV pool holds one kv head."""
from __future__ import annotations


import pytest
import torch

from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.model.runner import ModelRunner

from .tp_worker import (PROMPTS, logits_of, model_test_module, run_rank, run_rank_chain,
                        run_rank_custom_ar, run_rank_pdl, tiny_model_dirs)
from processes import free_port, run_ranks

TP = 4
CASES = {
    "llama": ("llama", dict(vocab_size=250, tie_word_embeddings=False)),
    "qwen2": ("qwen2", dict(tie_word_embeddings=False, save_kwargs={"max_shard_size": "150KB"})),
    "qwen3": ("qwen3", dict(head_dim=32, tie_word_embeddings=True)),
    # MoE: every expert's intermediate dim split over the ranks, one all-reduce after the
    # combine (a sparse and a dense layer mixed; Mixtral's w1/w2/w3 names, sharded checkpoint)
    "qwen3_moe": ("qwen3_moe", dict(head_dim=32, num_experts=8, num_experts_per_tok=3,
                                    moe_intermediate_size=48, norm_topk_prob=True,
                                    decoder_sparse_step=1, mlp_only_layers=[1])),
    "mixtral": ("mixtral", dict(num_local_experts=4, num_experts_per_tok=2,
                                save_kwargs={"max_shard_size": "200KB"})),
}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> list[str]:
    return tiny_model_dirs(tmp_path_factory, CASES)


def test_every_architecture_at_tp4_equals_tp1(model_dirs):
    method = f"tcp://127.0.0.1:{free_port()}"
    got = run_ranks(run_rank, lambda r, results: (r, TP, method, model_dirs, PROMPTS, results),
                    TP, TP * len(model_dirs))
    for model_dir in model_dirs:
        rows = [g for g in got if g[1] == model_dir]
        assert sorted(r[0] for r in rows) == list(range(TP))
        assert all(r[2][1] == 1 for r in rows)  # 2 kv heads over 4 ranks: one each
        tp_logits = [torch.from_numpy(a) for a in next(r[3] for r in rows if r[0] == 0)]
        ref = logits_of(ModelRunner(EngineConfig(model=model_dir, device="cpu",
                                                 max_total_tokens=256, max_running_requests=4)),
                        PROMPTS)
        for a, b in zip(tp_logits, ref):
            assert a.shape == b.shape
            torch.testing.assert_close(a, b, rtol=0, atol=1e-4)
            assert torch.equal(a.argmax(-1), b.argmax(-1))


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_custom_all_reduce_matches_nccl_on_two_gpus(tmp_path):
    """bf16 llama at TP=2 on GPUs: torch's symmetric-memory kernels, and the barrier-free
    all-reduce (fused with o_proj's add + norm, each down product's sum chained into the next
    norm), give NCCL's logits (bf16 rounding) and tokens."""
    model_test_module("tiny").tiny_model("llama", tmp_path, vocab_size=250,
                                         tie_word_embeddings=False)
    method = f"tcp://127.0.0.1:{free_port()}"
    got = run_ranks(run_rank_custom_ar,
                    lambda r, results: (r, 2, method, str(tmp_path), PROMPTS, results), 2, 6)
    by_mode = {g[1]: g for g in got if g[0] == 0}
    assert by_mode["lamport"][2].get("lamport", 0) > 0, by_mode["lamport"][2]
    nccl = [torch.from_numpy(a) for a in by_mode["nccl"][3]]
    report = {}
    for mode in ("symm", "lamport"):
        custom = [torch.from_numpy(a) for a in by_mode[mode][3]]
        report[mode] = ([round((b - a).abs().max().item(), 4) for a, b in zip(nccl, custom)],
                        [torch.equal(a.argmax(-1), b.argmax(-1)) for a, b in zip(nccl, custom)],
                        by_mode[mode][2])
    print("max |custom - nccl| per step, argmax equal, eager calls:", report)
    for mode, (diffs, same, _) in report.items():
        scale = max(a.abs().max().item() for a in nccl)
        assert all(d <= 0.05 * scale for d in diffs) and all(same), (mode, report)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_pdl_same_logits_at_tp2_or_4(tmp_path):
    """bf16 llama at TP=4 (TP=2 on 2 or 3 GPUs), batch-1 decode in CUDA graphs through the
    barrier-free all-reduce: with programmatic dependent launch (kernels/pdl.py) on the kernels,
    and on the all-reduce too, rank 0's logits are the same bits as without it, every step."""
    model_test_module("tiny").tiny_model("llama", tmp_path, vocab_size=250,
                                         tie_word_embeddings=False)
    method = f"tcp://127.0.0.1:{free_port()}"
    tp = 4 if torch.cuda.device_count() >= 4 else 2
    got = run_ranks(run_rank_pdl,
                    lambda r, results: (r, tp, method, str(tmp_path), PROMPTS[0], results), tp,
                    3 * tp)
    by_mode = {g[1]: g for g in got if g[0] == 0}
    if not by_mode["all"][3]:
        pytest.skip("no PDL on these GPUs (compute capability < 9.0 or an older Triton)")
    off = by_mode["off"][4]
    for mode in ("kernels", "all"):
        assert by_mode[mode][2].get("lamport", 0) > 0, by_mode[mode][2]
        on = by_mode[mode][4]
        assert len(on) == len(off) == 9
        for i, (a, b) in enumerate(zip(off, on)):
            assert (a == b).all(), (mode, i, float(abs(a - b).max()))


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_tp_chain_switches_same_tokens(tmp_path):
    """bf16 llama at TP=4 (TP=2 on 2 or 3 GPUs), batch-1 decode in CUDA graphs: the chain as
    first built (separate rotary and SiLU kernels under TP, serial spins, one weight block
    before PDL's wait) and with every tp-chain switch on (the epilogues on each rank's shard,
    one spin over all peers, more weight blocks before the wait) give the same tokens and
    logits within bf16 rounding; the epilogue ran only when on."""
    model_test_module("tiny").tiny_model("llama", tmp_path, vocab_size=250,
                                         tie_word_embeddings=False)
    method = f"tcp://127.0.0.1:{free_port()}"
    tp = 4 if torch.cuda.device_count() >= 4 else 2
    got = run_ranks(run_rank_chain,
                    lambda r, results: (r, tp, method, str(tmp_path), PROMPTS[0], results), tp,
                    2 * tp)
    by_mode = {g[1]: g for g in got if g[0] == 0}
    assert by_mode["base"][3] == 0 and by_mode["new"][3] > 0, (by_mode["base"][3],
                                                               by_mode["new"][3])
    base, new = by_mode["base"][4], by_mode["new"][4]
    assert len(base) == len(new) == 9
    scale = max(abs(a).max() for a in base)
    diffs = [float(abs(a - b).max()) for a, b in zip(base, new)]
    print("max |new - base| per step:", diffs, "bitwise equal:",
          [bool((a == b).all()) for a, b in zip(base, new)])
    for mode in ("base", "new"):
        assert by_mode[mode][2].get("lamport", 0) > 0, by_mode[mode][2]
    assert all(d <= 0.05 * scale for d in diffs), diffs
    assert all((a.argmax(-1) == b.argmax(-1)).all() for a, b in zip(base, new))
