"""Parallel layers at tp_size 2/4/8, one rank at a time in one process (no process group; the
test combines the partial results the collectives would): each rank's shard, loaded from the
full tensor through ``weight_loader``, computes its slice of the full layer."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sgdsl.runtime.distributed.state import TPGroup, get_tp_group, set_tp_group_for_test
from sgdsl.runtime.errors import ModelLoadError
from sgdsl.runtime.layers.linear import (ColumnParallelLinear, MergedColumnParallelLinear,
                                         QKVParallelLinear, RowParallelLinear, check_heads)
from sgdsl.runtime.layers.vocab_parallel import ParallelLMHead, VocabParallelEmbedding


@pytest.fixture
def as_rank():
    saved = get_tp_group()

    def use(rank: int, size: int) -> None:
        set_tp_group_for_test(TPGroup(rank, size))
    yield use
    set_tp_group_for_test(saved)


def _ranks(as_rank, size, build):
    out = []
    for rank in range(size):
        as_rank(rank, size)
        out.append(build())
    return out


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_column_and_row_compose_to_the_full_mlp(as_rank, tp):
    gen = torch.Generator().manual_seed(tp)
    w1, b1 = torch.randn(32, 16, generator=gen), torch.randn(32, generator=gen)
    w2, b2 = torch.randn(16, 32, generator=gen), torch.randn(16, generator=gen)
    x = torch.randn(5, 16, generator=gen)
    expected = F.linear(torch.relu(F.linear(x, w1, b1)), w2, b2)
    total = torch.zeros(5, 16)
    for rank in range(tp):
        as_rank(rank, tp)
        col, row = ColumnParallelLinear(16, 32, bias=True), RowParallelLinear(32, 16, bias=True)
        for layer, w, b in ((col, w1, b1), (row, w2, b2)):
            layer.weight.weight_loader(layer.weight, w)
            layer.bias.weight_loader(layer.bias, b)
        assert col.weight.shape == (32 // tp, 16) and row.weight.shape == (16, 32 // tp)
        partial = F.linear(torch.relu(col(x)), row.weight)  # before the all-reduce
        total += partial
    torch.testing.assert_close(total + b2, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("tp,kv", [(2, 2), (4, 2), (8, 2), (8, 8), (4, 1)])
def test_qkv_heads_split_and_kv_replicated(as_rank, tp, kv):
    heads, hd, hidden = 8, 4, 12
    full = {n: torch.randn(rows * hd, hidden) for n, rows in (("q", heads), ("k", kv), ("v", kv))}
    layers = _ranks(as_rank, tp, lambda: QKVParallelLinear(hidden, hd, heads, kv))
    for layer in layers:
        for name, t in full.items():
            layer.load_shard(name, "weight", t)
    replicas = max(1, tp // kv)
    for rank, layer in enumerate(layers):
        q_rows, kv_rows = heads // tp * hd, max(1, kv // tp) * hd
        assert (layer.num_heads, layer.num_kv_heads) == (heads // tp, max(1, kv // tp))
        w = layer.weight
        assert torch.equal(w[:q_rows], full["q"][rank * q_rows:(rank + 1) * q_rows])
        kv_index = rank // replicas
        want = full["k"][kv_index * kv_rows:(kv_index + 1) * kv_rows]
        assert torch.equal(w[q_rows:q_rows + kv_rows], want)
        assert torch.equal(w[q_rows + kv_rows:], full["v"][kv_index * kv_rows:(kv_index + 1) * kv_rows])


def test_merged_full_tensor_equals_shard_by_shard(as_rank):
    """The whole packed tensor (dummy init) lands where the per-part checkpoint tensors do."""
    gate, up = torch.randn(8, 6), torch.randn(8, 6)
    for rank in range(2):
        as_rank(rank, 2)
        a, b = MergedColumnParallelLinear(6, {"gate": 8, "up": 8}), MergedColumnParallelLinear(6, [8, 8])
        a.weight.weight_loader(a.weight, torch.cat([gate, up]))
        b.load_shard(0, "weight", gate)
        b.load_shard(1, "weight", up)
        assert torch.equal(a.weight, b.weight)
        assert torch.equal(a.weight[:4], gate[rank * 4:rank * 4 + 4])


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_vocab_parallel_embedding_and_head_with_padding(as_rank, tp):
    vocab, hidden = 37, 8  # 37 is prime: every tp pads the last block
    table = torch.randn(vocab, hidden)
    ids = torch.tensor([0, 5, 36, 17, 9])
    embeds = _ranks(as_rank, tp, lambda: VocabParallelEmbedding(vocab, hidden))
    heads = _ranks(as_rank, tp, lambda: ParallelLMHead(vocab, hidden))
    h = torch.randn(3, hidden)
    total, cols = torch.zeros(5, hidden), []
    for rank, (emb, head) in enumerate(zip(embeds, heads)):
        emb.weight.weight_loader(emb.weight, table)
        head.weight.weight_loader(head.weight, table)
        as_rank(rank, tp)
        total += emb(ids)  # the all-reduce is a no-op without a group: we sum here
        cols.append(F.linear(h, head.weight))
    torch.testing.assert_close(total, table[ids])
    torch.testing.assert_close(torch.cat(cols, -1)[:, :vocab], F.linear(h, table))
    assert torch.all(torch.cat(cols, -1)[:, vocab:] == 0)


def test_heads_that_do_not_split_are_refused():
    with pytest.raises(ModelLoadError, match="tp_size=2 does not divide the model's 9 attention heads"):
        check_heads(9, 3, 2)
    with pytest.raises(ModelLoadError, match="3 kv heads"):
        check_heads(12, 3, 2)
    check_heads(12, 3, 6)  # kv heads replicated twice
    check_heads(9, 3, 3)


def test_shard_shape_mismatch_names_the_layer(as_rank):
    as_rank(1, 2)
    col = ColumnParallelLinear(4, 8)
    with pytest.raises(ModelLoadError, match="ColumnParallelLinear rank 1"):
        col.weight.weight_loader(col.weight, torch.zeros(8, 5))
