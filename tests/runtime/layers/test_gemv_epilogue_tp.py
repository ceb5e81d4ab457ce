"""Which layers take the batch-1 matrix-vector kernel with an epilogue under tensor parallelism
(layers/gemv_epilogue.py, layers/gemv_fusion.py): a column-parallel shard (qkv, gate_up) does,
unless ``SGDSL_GEMV_EPILOGUE_TP=0``; a row-parallel one (o, down) never does (its partial sum
must be all-reduced before anything is added). The kernels themselves are tested in
tests/runtime/kernels (test_gemv_pairs.py, test_pdl.py); the TP=4 model on GPUs in
tests/runtime/distributed/test_tp_models.py."""
from __future__ import annotations

import torch

from sgdsl.runtime.layers import gemv_epilogue
from sgdsl.runtime.layers.gemv_fusion import gemv_args
from sgdsl.runtime.layers.linear import MergedColumnParallelLinear, RowParallelLinear


def _as_rank_of(linear, tp: int):
    """The layer as one rank of a ``tp``-way group sees it (the shapes do not matter here)."""
    linear.tp_size = tp
    return linear


def test_column_shards_take_the_kernel_row_shards_do_not(monkeypatch):
    bf = torch.bfloat16
    gate_up = _as_rank_of(MergedColumnParallelLinear(64, [96, 96], dtype=bf), 4)
    down = _as_rank_of(RowParallelLinear(96, 64, dtype=bf), 4)
    w, scale, tile = gemv_args(gate_up, sharded=True)
    assert w is gate_up.weight and scale is None and len(tile) == 3
    assert gemv_args(gate_up) is None  # the residual-add fusion's rule: tp 1 only
    assert gemv_args(down, sharded=True) is None
    gathered = _as_rank_of(MergedColumnParallelLinear(64, [96, 96], dtype=bf), 4)
    gathered.gather_output = True  # its output is all-gathered: no epilogue on the shard
    assert gemv_args(gathered, sharded=True) is None
    assert gemv_epilogue._sharded()
    monkeypatch.setenv("SGDSL_GEMV_EPILOGUE_TP", "0")
    assert not gemv_epilogue._sharded()
