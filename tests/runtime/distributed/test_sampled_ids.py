"""tp-step: the check that TP ranks sampled the same ids (``distributed/sampled_ids.py``); the
engine-level half (ranks agree over a sampling workload) is in test_tp_engine.py."""
from __future__ import annotations

import pytest
import torch

from sgdsl.runtime.distributed import sampled_ids


def test_disagreement_names_the_rank_and_rows():
    assert sampled_ids.disagreement([[1, 2, 3], [1, 2, 3], [1, 2, 3]]) is None
    problem = sampled_ids.disagreement([[1, 2, 3], [1, 2, 3], [1, 9, 3]])
    assert problem is not None and "TP rank 2" in problem and "rows [1]" in problem


def test_one_rank_keeps_its_ids_in_every_mode(monkeypatch):
    ids = torch.tensor([4, 5])
    for mode in sampled_ids.MODES:
        monkeypatch.setenv("SGDSL_TP_IDS", mode)
        assert sampled_ids.agree(ids) is ids
    monkeypatch.setenv("SGDSL_TP_IDS", "sometimes")
    with pytest.raises(ValueError, match="SGDSL_TP_IDS"):
        sampled_ids.agree(ids)
