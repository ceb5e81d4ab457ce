"""DraftTree shape helpers and the speculative_* engine options (no model needed)."""
from __future__ import annotations

import pytest

from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.errors import InvalidRequestError
from sgdsl.runtime.server.cli import parse_args
from sgdsl.runtime.speculative.base import DraftTree


def test_chain_and_tree_helpers():
    chain = DraftTree.chain([5, 6, 7])
    assert chain.parents == (-1, 0, 1) and chain.is_chain and chain.depth == 3
    tree = DraftTree((5, 9, 6, 7), (-1, -1, 0, 0))
    assert not tree.is_chain and tree.depths == (1, 1, 2, 2) and tree.depth == 2
    assert tree.children(-1) == [0, 1] and tree.children(0) == [2, 3]
    assert tree.path(3) == [0, 3]
    mask = tree.ancestor_mask()
    assert mask[3] == [True, False, False, True] and mask[1] == [False, True, False, False]
    assert tree.subtree([0, 3]) == DraftTree((5, 7), (-1, 0))
    assert tree.prefix(2) == DraftTree((5, 9), (-1, -1))
    assert len(DraftTree()) == 0 and DraftTree().depth == 0


def test_bad_trees_are_refused():
    with pytest.raises(ValueError):
        DraftTree((1, 2), (-1,))
    with pytest.raises(ValueError):
        DraftTree((1, 2), (1, -1))  # a parent after its child
    with pytest.raises(ValueError):
        DraftTree((1, 2), (-1, 0)).subtree([1])


def test_options_normalised_and_validated():
    config = EngineConfig(speculative_algorithm="ngram")
    assert config.speculative_algorithm == "NGRAM"
    assert config.speculative_num_draft_tokens == 4 and config.speculative_eagle_topk == 1
    assert EngineConfig(speculative_algorithm="none").speculative_algorithm is None
    assert EngineConfig().speculative_algorithm is None
    with pytest.raises(InvalidRequestError, match="speculative_algorithm"):
        EngineConfig(speculative_algorithm="medusa")
    with pytest.raises(InvalidRequestError, match="speculative_draft_model_path"):
        EngineConfig(speculative_algorithm="standalone")
    with pytest.raises(InvalidRequestError, match="speculative_num_draft_tokens"):
        EngineConfig(speculative_algorithm="ngram", speculative_num_draft_tokens=0)
    with pytest.raises(InvalidRequestError, match="max_match_window"):
        EngineConfig(speculative_algorithm="ngram", speculative_ngram_min_match_window_size=4,
                     speculative_ngram_max_match_window_size=2)


def test_serve_flags():
    engine, _ = parse_args(["--speculative-algorithm", "Eagle3",
                            "--speculative-draft-model-path", "/d", "--speculative-num-steps",
                            "3", "--speculative-eagle-topk", "2",
                            "--speculative-num-draft-tokens", "6"])
    assert engine.speculative_algorithm == "EAGLE3"
    assert (engine.speculative_num_steps, engine.speculative_eagle_topk,
            engine.speculative_num_draft_tokens) == (3, 2, 6)
    assert engine.speculative_draft_model_path == "/d"


def test_stats_and_metrics_histogram():
    from sgdsl.runtime.server.metrics import ServerMetrics
    from sgdsl.runtime.speculative.stats import Backoff, SpecStats

    stats = SpecStats(max_draft=4)
    for drafted, accepted in ((4, 4), (4, 1), (0, 0), (3, 0)):
        stats.observe(drafted, accepted, accepted + 1)
    snap = stats.as_dict()
    assert snap["spec_accept_length"]["cumulative"] == [1, 2, 2, 2, 3]
    assert snap["spec_accept_length"]["count"] == 3 and snap["spec_accept_rate"] == 5 / 11
    body = ServerMetrics(stats=lambda: snap).render().decode()
    assert 'sgdsl_engine_spec_accept_length_bucket{le="1.0"} 2.0' in body
    assert "sgdsl_engine_spec_accept_rate" in body
    backoff = Backoff()
    for _ in range(20):  # nothing accepted: it backs off, longer each time
        backoff.update(0, 0.3)
    assert backoff.wait > 0 and backoff.penalty > 2


def test_backoff_follows_a_rising_bar():
    from sgdsl.runtime.speculative.stats import Backoff

    backoff = Backoff(avg=2.0)
    assert not backoff.hold(1.8) and backoff.wait == 0  # above the cost gate's bar: drafts
    assert backoff.hold(2.5) and backoff.wait == 1 and backoff.avg == 2.5  # the bar rose
    assert not backoff.hold(3.0) and backoff.wait == 1  # already waiting: no second start
    assert backoff.skip() and not backoff.skip()
    backoff.update(4, 2.5)  # the probe accepted every draft: above the bar, shorter waits
    assert backoff.wait == 0 and backoff.penalty == 1
    backoff.update(0, 2.9)
    assert backoff.wait == 1 and backoff.avg == 2.9  # below: waits, then a fresh start
