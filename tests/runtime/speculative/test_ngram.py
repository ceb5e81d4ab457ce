"""NGRAM drafter: longest suffix match, most recent occurrence, branches, loops, resync."""
from __future__ import annotations

from types import SimpleNamespace

from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.speculative.base import DraftTree
from sgdsl.runtime.speculative.ngram import NgramDrafter


def _drafter(**kw) -> NgramDrafter:
    return NgramDrafter(EngineConfig(speculative_algorithm="ngram", **kw))


def test_longest_suffix_most_recent_occurrence():
    d = _drafter()
    req = SimpleNamespace(rid="a", all_ids=[1, 2, 3, 4, 5, 9, 7, 3, 8, 1, 2, 3])
    # suffix "1 2 3" (3 tokens) beats the more recent 1-token match "3" (followed by 8)
    assert d.propose([req], 4) == [DraftTree.chain([4, 5, 9, 7])]
    req.all_ids = req.all_ids + [4]  # incremental: now "1 2 3 4"
    assert d.propose([req], 3) == [DraftTree.chain([5, 9, 7])]
    req.all_ids = [6, 6, 6, 5]  # diverged (not an extension): rebuilt, no match
    assert d.propose([req], 3) == [DraftTree()]


def test_loops_continue_and_min_window():
    d = _drafter()
    req = SimpleNamespace(rid="a", all_ids=[9, 1, 2, 1, 2, 1, 2])
    assert d.propose([req], 5) == [DraftTree.chain([1, 2, 1, 2, 1])]
    strict = _drafter(speculative_ngram_min_match_window_size=3)
    req = SimpleNamespace(rid="b", all_ids=[4, 1, 2, 7, 1, 2])  # only 2 tokens match
    assert strict.propose([req], 3) == [DraftTree()]


def test_branches_and_release():
    d = _drafter(speculative_ngram_max_bfs_breadth=3)
    req = SimpleNamespace(rid="a", all_ids=[1, 2, 7, 1, 2, 8, 8, 1, 2])
    tree = d.propose([req], 4)[0]
    assert tree == DraftTree((8, 8, 1, 7), (-1, 0, 1, -1))  # recent "8 8 1" + sibling "7"
    assert d.check_idle()
    d.release("a")
    assert d.check_idle() == []
