"""The verify forward on the tiny model (torch_native attention, CPU): a draft tree's rows (a
TARGET_VERIFY extend with the tree mask) give the same logits as each root-to-node path fed as a
chain (decode rows); and accepting a path keeps exactly its KV columns."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sgdsl.runtime.cache.radix import RadixCache
from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.model.forward_batch import ForwardMode
from sgdsl.runtime.model.runner import ModelRunner
from sgdsl.runtime.scheduler.memory import KVMemory
from sgdsl.runtime.speculative.accept import commit_kv
from sgdsl.runtime.speculative.base import DraftTree
from sgdsl.runtime.speculative.verify_batch import build_verify

PROMPT = [5, 17, 300, 42, 9, 77]


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    runner = ModelRunner(EngineConfig(str(tiny_model_dir), load_format="dummy",
                                      max_total_tokens=256, max_running_requests=4))
    pool = runner.token_kv_pool
    return runner, KVMemory(runner.req_to_token_pool, pool, RadixCache(pool, disable=True))


def _request(runner, memory, prompt: list[int] = PROMPT):
    """A request whose prompt KV is written (fed as one chain of decode rows)."""
    req = SimpleNamespace(req_pool_idx=runner.req_to_token_pool.alloc(), kv_len=0,
                          all_ids=prompt[:1])
    batch, _ = build_verify([req], [DraftTree.chain(prompt[1:])], memory, runner.device)
    runner.forward(batch)
    req.kv_len, req.all_ids = len(prompt), prompt + [11]
    return req


def test_tree_rows_equal_path_chains(setup):
    runner, memory = setup
    tree = DraftTree((21, 22, 23, 24, 25), (-1, -1, 0, 1, 2))
    req = _request(runner, memory)
    batch, layout = build_verify([req], [tree], memory, runner.device)
    assert batch.mode is ForwardMode.TARGET_VERIFY
    tree_logits = runner.forward(batch)
    for leaf in (3, 4):  # paths 22 -> 24 and 21 -> 23 -> 25
        path = tree.path(leaf)
        other = _request(runner, memory)
        chain = DraftTree.chain([tree.tokens[i] for i in path])
        chain_batch, _ = build_verify([other], [chain], memory, runner.device)
        assert chain_batch.mode is ForwardMode.DECODE
        chain_logits = runner.forward(chain_batch)
        for depth, node in enumerate(path):
            assert torch.allclose(tree_logits[1 + node], chain_logits[1 + depth], atol=1e-4)
        assert torch.allclose(tree_logits[0], chain_logits[0], atol=1e-4)

    # accept the path to node 4 (21, 23, 25): its slots move to the columns after the root
    slots = layout.slots
    free_before = memory.kv_pool.available()
    commit_kv(memory, req, len(PROMPT), len(tree), tree.path(4), slots)
    row = memory.host_table[req.req_pool_idx]
    assert row[len(PROMPT):len(PROMPT) + 4].tolist() == slots[[0, 1, 3, 5]].tolist()
    assert req.kv_len == len(PROMPT) + 4
    assert memory.kv_pool.available() == free_before + 2  # nodes 22 and 24 freed


@pytest.mark.parametrize("tree", [DraftTree.chain([21, 22]), DraftTree((21, 22, 23), (-1, -1, 0))])
def test_jump_forward_tokens_fed_ahead_of_the_root(setup, tree):
    """A request with tokens that have no KV (jump-forward: ``pending_forced``) feeds them
    before its root; its root and node rows equal a request that had them in its KV."""
    runner, memory = setup
    forced = [11, 12, 13]
    req = _request(runner, memory)
    req.all_ids = PROMPT + forced  # kv_len stays len(PROMPT): 3 tokens to feed
    batch, layout = build_verify([req], [tree], memory, runner.device)
    assert layout.first == [2] and layout.kv_lens == [len(PROMPT) + 2] and layout.fed_extra
    logits = runner.forward(batch)[layout.verify_rows]
    ref = _request(runner, memory)
    ref_batch, _ = build_verify([ref], [DraftTree.chain(forced[1:])], memory, runner.device)
    runner.forward(ref_batch)
    ref.kv_len, ref.all_ids = len(PROMPT) + 2, PROMPT + forced
    ref_batch, _ = build_verify([ref], [tree], memory, runner.device)
    assert torch.allclose(logits, runner.forward(ref_batch), atol=1e-4)
