"""The speculative CUDA graphs' logic on the CPU (tiny random Llama, torch_native attention):
the graph runners' padded forwards (what a replay computes: ``run`` without captured graphs)
give the eager forwards' results, and their padding is inert (no KV written outside the dummy
slot 0, a padded request reads no request-table row). The captured graphs themselves are
checked on a GPU (test_spec_graphs_gpu.py)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sgdsl.runtime.speculative.base import DraftTree
from sgdsl.runtime.speculative.verify_graphs import fits, mask_cells, padded_rows

from .test_eagle import STEPS, _config, _prefill, _target, dirs  # noqa: F401 (fixture)
from .test_spec_scheduler import ScriptedDrafter, TreeStandIn, _spec, make_harness  # noqa: F401
from .test_verify_forward import _request  # (test_spec_graphs_gpu imports it from here too)

PROMPT = [5, 17, 300, 42, 9, 77]
K = 5  # draft tokens: verify blocks of 6 rows


def test_padded_layout():
    assert padded_rows([2, 1, 3], 4) == [0, 1, 4, 8, 9, 10]
    # request 0's 1x1 mask, then request 1's 2x2 mask in its 3x3 block
    assert mask_cells([1, 2], 3) == [0, 9, 10, 12, 13]
    assert fits([3, 6], [10, 20], width=6, max_bs=4, context_len=512)
    assert not fits([3, 7], [10, 20], width=6, max_bs=4, context_len=512)  # a block too long
    assert not fits([1] * 5, [10] * 5, width=6, max_bs=4, context_len=512)  # too many requests
    assert not fits([3], [507], width=6, max_bs=4, context_len=512)  # block past the context


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    from sgdsl.runtime.cache.radix import RadixCache
    from sgdsl.runtime.config import EngineConfig
    from sgdsl.runtime.model.runner import ModelRunner
    from sgdsl.runtime.scheduler.memory import KVMemory

    runner = ModelRunner(EngineConfig(str(tiny_model_dir), load_format="dummy", device="cpu",
                                      num_threads=1, max_total_tokens=256,
                                      max_running_requests=4))
    pool = runner.token_kv_pool
    return runner, KVMemory(runner.req_to_token_pool, pool, RadixCache(pool, disable=True))


def test_padded_tree_verify_equals_eager(setup):
    """Three requests (one on table row 0, one with no draft, one with jump-forward tokens
    fed ahead of its root) pad to 4 blocks of K + 1 rows."""
    from sgdsl.runtime.model.forward_batch import ForwardMode
    from sgdsl.runtime.speculative.verify_batch import build_verify
    from sgdsl.runtime.speculative.verify_graphs import VerifyGraphs

    runner, memory = setup
    reqs = [_request(runner, memory, PROMPT), _request(runner, memory, PROMPT[::-1]),
            _request(runner, memory, PROMPT[:3])]
    assert reqs[0].req_pool_idx == 0
    reqs[2].all_ids = PROMPT[:3] + [12, 13]  # 2 tokens without KV: fed ahead of the root
    trees = [DraftTree((21, 22, 23, 24, 25), (-1, -1, 0, 1, 2)), DraftTree(),
             DraftTree((31, 32, 33), (-1, 0, 0))]
    batch, _ = build_verify(reqs, trees, memory, runner.device)
    assert batch.mode is ForwardMode.TARGET_VERIFY and batch.extend_seq_lens_cpu == [6, 1, 5]
    graphs = VerifyGraphs(runner, max_bs=4, width=K + 1)  # sizes 1, 2, 4
    assert graphs.can_run(batch)
    want = runner.forward(batch)
    pool = runner.token_kv_pool
    before = [b.clone() for b in pool.k_buffer]
    got = graphs.run(batch)
    assert graphs.padded_size(3) == 4 and graphs.replays == 0  # (nothing captured on CPU)
    assert got.shape == want.shape and torch.isfinite(got).all()
    assert float((got - want).abs().max()) < 1e-4
    for old, new in zip(before, pool.k_buffer):  # the padded rows wrote slot 0 only
        assert torch.allclose(old[1:], new[1:], atol=1e-5)

    # the same requests again, with more jump-forward tokens than a block holds: eager
    reqs[2].all_ids = PROMPT[:3] + [12, 13, 14, 15, 16]
    memory.kv_pool.free(torch.unique(batch.out_cache_loc.cpu()))
    big, _ = build_verify(reqs, trees, memory, runner.device)
    assert not graphs.can_run(big)
    memory.kv_pool.free(torch.unique(big.out_cache_loc.cpu()))


def test_eagle_head_graph_rows_equal_eager(dirs):  # noqa: F811 (the fixture)
    """Drafts of three requests through the head graphs' padded forwards (decode rows padded
    to 8) equal the eager drafts, for a kept and for a fresh head KV."""
    from sgdsl.runtime.scheduler.req import Req
    from sgdsl.runtime.sampling_params import SamplingParams
    from sgdsl.runtime.speculative.eagle import EagleDrafter
    from sgdsl.runtime.speculative.eagle_graphs import HeadGraphs

    config = _config(dirs, "EAGLE3")
    runner, first = _target(config)
    reqs = [first] + [Req(r, list(range(40 + i, 47 + i)), SamplingParams(temperature=0))
                      for i, r in enumerate("bc")]
    for req in reqs[1:]:
        req.req_pool_idx = runner.req_to_token_pool.alloc()
    drafter = EagleDrafter(config, runner)
    assert drafter.graphs is None  # CPU: no graphs
    graphs = HeadGraphs(drafter, max_rows=16)  # sizes 1, 2, 4, 8, 16
    for req in reqs:
        _prefill(runner, req, req.all_ids)
    eager = drafter.propose(reqs, 6)
    drafter.graphs = graphs
    for req in reqs:
        drafter.release(req.rid)
    padded = drafter.propose(reqs, 6)  # the feed (an extend) eager, the levels padded 6 -> 8
    assert padded == eager and drafter.graph_steps == STEPS - 1
    for req, tree in zip(reqs, padded):  # the next step: one draft accepted, a new token
        req.output_ids = [tree.tokens[0], 7]
        _prefill(runner, req, req.all_ids)
    kept = drafter.propose(reqs, 6)  # the feed too: decode rows (2 per request)
    assert drafter.graph_steps == 2 * STEPS - 1
    # padded rows read table row 0: no request's, its entries the dummy slot 0
    table = drafter.req_to_token_pool.req_to_token
    assert drafter.kv.pad_row == 0 and not table[0].any()
    assert all(e.row != 0 for e in drafter.kv.entries.values())
    drafter.graphs = None
    for req in reqs:
        drafter.release(req.rid)
    assert drafter.check_idle() == []
    assert drafter.propose(reqs, 6) == kept
    for req in reqs:
        drafter.release(req.rid)
    assert drafter.check_idle() == []


class PaddedStandIn(TreeStandIn):
    """The scheduler's stand-in model (it reads each row's prefix and tree ancestors back from
    the KV slots) as the verify graphs' runner."""

    device = torch.device("cpu")

    def forward_eager(self, batch):
        return self.forward(batch)


def test_scheduler_tree_steps_through_padded_blocks(make_harness):  # noqa: F811 (fixture)
    """Speculative steps whose tree verifies go through the verify graphs' padded forward (3
    requests in 4 blocks of 6 rows): outputs equal the stand-in's greedy reference, the KV of
    rejected nodes is freed (the harness checks the idle invariant)."""
    from scheduler.standin import expected
    from sgdsl.runtime.speculative.verify_graphs import VerifyGraphs

    h = make_harness()
    h.sched.runner = h.runner = runner = PaddedStandIn(h.runner)
    _spec(h, ScriptedDrafter(wrong_at=None, branch=True), k=K)
    h.sched.spec.verify_graphs = VerifyGraphs(runner, max_bs=4, width=K + 1)
    # lengths apart: trees cut short by max_new_tokens at different steps (ragged blocks)
    prompts = {"a": ([1, 2, 3], 13), "b": ([7, 7, 7, 7], 9), "c": ([5, 4, 3, 2, 1, 9], 16)}
    for rid, (p, n) in prompts.items():
        h.submit(rid, p, max_new_tokens=n, ignore_eos=True)
    h.run()
    for rid, (p, n) in prompts.items():
        assert h.outs[rid] == expected(p, n), rid
    padded = [b for b in runner.forwards if b.spec_info is not None]
    assert padded and all(b.extend_seq_lens_cpu == [K + 1] * b.batch_size for b in padded)
    assert any(b.batch_size == 4 for b in padded)


def test_graphs_follow_the_flags(tiny_model_dir):
    """Verify graphs only where the target has decode graphs and drafts may branch; the
    STANDALONE draft runner's graphs off with either flag."""
    from sgdsl.runtime.config import EngineConfig
    from sgdsl.runtime.speculative.standalone import draft_engine_config
    from sgdsl.runtime.speculative.verify_graphs import VerifyGraphs

    def config(**kw):
        return EngineConfig(str(tiny_model_dir), speculative_algorithm="NGRAM", **kw)

    no_graphs = SimpleNamespace(cuda_graph_runner=None)
    assert VerifyGraphs.create(config(speculative_ngram_max_bfs_breadth=2), no_graphs) is None
    graphs = SimpleNamespace(cuda_graph_runner=object())  # (a capture would need CUDA)
    assert VerifyGraphs.create(config(), graphs) is None  # chains only: the decode graphs
    assert VerifyGraphs.create(config(speculative_ngram_max_bfs_breadth=2,
                                      speculative_disable_cuda_graph=True), graphs) is None
    target = SimpleNamespace(context_len=512, max_total_tokens=256, device=torch.device("cpu"),
                             dtype=torch.float32)
    standalone = dict(speculative_algorithm="STANDALONE",
                      speculative_draft_model_path=str(tiny_model_dir))
    for flags, off in (({}, False), ({"disable_cuda_graph": True}, True),
                       ({"speculative_disable_cuda_graph": True}, True)):
        cfg = EngineConfig(str(tiny_model_dir), **standalone, **flags)
        assert draft_engine_config(cfg, target, 3).disable_cuda_graph is off


def test_chain_verifies_on_the_decode_graphs_are_counted(make_harness):  # noqa: F811
    """Chain verifies (DECODE rows) replay the target's decode graphs when the rows fit them:
    ``spec_verify_decode_graph_steps`` counts those (``spec_verify_graph_steps`` only tree
    replays), with the decode graph runner's own condition; more rows than it captured: none."""
    from sgdsl.runtime.model.cuda_graph_runner import CudaGraphRunner

    def decode_graphs(max_bs):  # the real ``can_run`` on captured sizes up to ``max_bs``
        graphs = SimpleNamespace(max_bs=max_bs, graphs={max_bs: None})
        graphs.can_run = lambda b: CudaGraphRunner.can_run(graphs, b)
        return graphs

    for max_bs, counted in ((8, True), (4, False)):  # a chain of 4 feeds 5 rows
        h = make_harness()
        h.runner.cuda_graph_runner = decode_graphs(max_bs)
        _spec(h, ScriptedDrafter(wrong_at=None))
        h.submit("a", [1, 2, 3], max_new_tokens=12, ignore_eos=True)
        h.run()
        stats = h.sched.stats()
        assert stats["spec_verify_steps"] > 0 and stats["spec_verify_graph_steps"] == 0
        assert stats["spec_verify_decode_graph_steps"] == (
            stats["spec_verify_steps"] if counted else 0), max_bs
