"""On the GPU (run on the GPU machine): the speculative CUDA graphs. A captured tree-verify
graph replays the eager TARGET_VERIFY forward's logits (padded batch, padded blocks), and for
NGRAM trees, EAGLE, EAGLE3 and STANDALONE, greedy outputs with the graphs (verify and draft)
equal the same engine's with them off (``speculative_disable_cuda_graph``) and the
non-speculative engine's, token for token, on a tiny random Llama in fp32 (triton attention)
whose weights are large enough for a tie-free argmax (as test_gpu_model.py)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

# a batch of 5 (graphs for 8 requests: padded), then one request alone; ``reference`` puts a
# prompt for an NGRAM tree first
PROMPTS = [list(range(100, 140)), [7, 7, 7], [9, 8, 7, 6, 5, 9, 8, 7, 6, 9, 8],
           list(range(300, 310)) * 3]
PARAMS = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}
BASE = dict(dtype="float32", device="cuda", max_total_tokens=8192, max_running_requests=8,
            grammar_backend="none", speculative_min_accept_per_step=0.0)


# the CPU tests' tiny Llama (tests/conftest.py TINY_CONFIG: eagle_heads.py's heads fit it),
# 4 layers; the tokenizer is the GPU benchmarks' stand-in (the device has no embedded model)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=49152, max_position_embeddings=512,
            rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True, bos_token_id=1,
            eos_token_id=2, hidden_act="silu")
TOKENIZER = Path(__file__).resolve().parents[3] / "benchmarks" / "gpu" / "tokenizer"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """The tiny target with peaked random weights (a tie-free argmax), and both heads."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from .eagle_heads import write_head

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.08)
    root = tmp_path_factory.mktemp("spec-gpu")
    model.save_pretrained(root / "target")
    for name in TOKENIZER.iterdir():
        shutil.copy(name, root / "target" / name.name)
    base = json.loads((root / "target" / "config.json").read_text())
    return {"target": root / "target", "EAGLE": write_head(root / "eagle", base, False),
            "EAGLE3": write_head(root / "eagle3", base, True)}


SPECS = {
    "NGRAM": dict(speculative_num_draft_tokens=4, speculative_ngram_max_bfs_breadth=3),
    "EAGLE": dict(speculative_num_steps=3, speculative_eagle_topk=4,
                  speculative_num_draft_tokens=6),
    "EAGLE3": dict(speculative_num_steps=3, speculative_eagle_topk=2,
                   speculative_num_draft_tokens=4),
    "STANDALONE": dict(speculative_num_draft_tokens=4),
}


def _generate(dirs, prompts: list[list[int]], **kw) -> tuple[list[list[int]], dict]:
    from sgdsl.runtime import Engine

    with Engine(str(dirs["target"]), **BASE, **kw) as engine:
        out = engine.generate(input_ids=prompts, sampling_params=PARAMS)
        one = engine.generate(input_ids=prompts[0], sampling_params=PARAMS)  # batch 1
        stats = engine.stats()
        engine.check_idle_integrity()
    return [o["output_ids"] for o in out] + [one["output_ids"]], stats


@pytest.fixture(scope="module")
def reference(dirs) -> tuple[list[list[int]], list[list[int]]]:
    """(prompts, non-speculative outputs). The first prompt is ``B t x B t y B`` where ``t`` is
    the model's next token after ``B`` both alone and there: after it, NGRAM's longest match
    ``B t`` continues two ways (x, y), a tree. (Some x, y keep the next token: searched.)"""
    from sgdsl.runtime import Engine

    base, one = [1, 2, 3, 4, 5, 6], dict(PARAMS, max_new_tokens=1)
    with Engine(str(dirs["target"]), **BASE) as engine:
        t = engine.generate(input_ids=base, sampling_params=one)["output_ids"][0]
        tries = [base + [t, 50 + i] + base + [t, 60 + i] + base for i in range(16)]
        nexts = [o["output_ids"][0] for o in engine.generate(input_ids=tries, sampling_params=one)]
    assert t in nexts, "no prompt of the family keeps the next token"
    prompts = [tries[nexts.index(t)]] + PROMPTS
    return prompts, _generate(dirs, prompts)[0]


@pytest.mark.parametrize("algo", list(SPECS))
def test_graphs_equal_eager_and_non_speculative(dirs, reference, algo):
    draft = {"STANDALONE": dirs["target"]}.get(algo, dirs.get(algo))
    kw = dict(SPECS[algo], speculative_algorithm=algo, speculative_min_speedup=0,
              speculative_draft_model_path=None if draft is None else str(draft))
    prompts, ref = reference
    graphed, g = _generate(dirs, prompts, **kw)
    eager, e = _generate(dirs, prompts, speculative_disable_cuda_graph=True, **kw)
    assert graphed == ref
    assert eager == ref
    assert g["spec_verify_steps"] > 0 and g["spec_draft_tokens"] > 0
    if algo != "STANDALONE":  # trees: the verify graphs ran
        assert g["spec_tree_steps"] > 0 and g["spec_verify_graph_steps"] > 0
    if algo != "NGRAM":  # a draft model: its graphs ran
        assert g["spec_draft_graph_steps"] > 0
    assert e["spec_verify_graph_steps"] == 0 and e["spec_draft_graph_steps"] == 0


def test_verify_graph_replay_equals_eager(dirs):
    """The CPU test's batch (three requests, one on table row 0, one without a draft, one
    with jump-forward tokens) through a captured graph."""
    from sgdsl.runtime.cache.radix import RadixCache
    from sgdsl.runtime.config import EngineConfig
    from sgdsl.runtime.model.runner import ModelRunner
    from sgdsl.runtime.scheduler.memory import KVMemory
    from sgdsl.runtime.speculative.base import DraftTree
    from sgdsl.runtime.speculative.verify_batch import build_verify
    from sgdsl.runtime.speculative.verify_graphs import VerifyGraphs

    from .test_spec_graphs import PROMPT, _request

    runner = ModelRunner(EngineConfig(str(dirs["target"]), device="cuda", dtype="float32",
                                      max_total_tokens=256, max_running_requests=4))
    assert runner.cuda_graph_runner is not None
    pool = runner.token_kv_pool
    memory = KVMemory(runner.req_to_token_pool, pool, RadixCache(pool, disable=True))
    reqs = [_request(runner, memory, PROMPT), _request(runner, memory, PROMPT[::-1]),
            _request(runner, memory, PROMPT[:3])]
    reqs[2].all_ids = PROMPT[:3] + [12, 13]
    trees = [DraftTree((21, 22, 23, 24, 25), (-1, -1, 0, 1, 2)), DraftTree(),
             DraftTree((31, 32, 33), (-1, 0, 0))]
    batch, _ = build_verify(reqs, trees, memory, runner.device)
    graphs = VerifyGraphs(runner, max_bs=4, width=6)
    graphs.capture()
    want = runner.forward(batch)
    got = graphs.run(batch)
    assert graphs.replays == 1
    assert float((got - want).abs().max()) < 1e-3
