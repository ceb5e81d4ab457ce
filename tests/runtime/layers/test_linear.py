"""Linear / PackedLinear: shard loading, and the CPU split layout computing the same product."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sgdsl.runtime.errors import ModelLoadError
from sgdsl.runtime.layers.linear import Linear, PackedLinear, cpu_layout


@pytest.mark.parametrize("splits", [1, 2, 4, 3])
@pytest.mark.parametrize("rows", [1, 5])
def test_cpu_layout_same_product(splits, rows):
    lin = Linear(12, 8, bias=True)
    lin.weight.data.normal_()
    lin.bias.data.normal_()
    x = torch.randn(rows, 12)
    expected = F.linear(x, lin.weight, lin.bias)
    lin.use_cpu_layout(splits)
    assert lin.weight.shape[0] == (splits if 8 % splits == 0 else 1)
    torch.testing.assert_close(lin(x), expected, rtol=1e-5, atol=1e-5)


def test_cpu_layout_blocks():
    w = torch.arange(12.0).view(4, 3)  # [out=4, in=3]
    blocks = cpu_layout(w, 2)
    assert torch.equal(blocks[0], w[:2].t()) and torch.equal(blocks[1], w[2:].t())


def test_packed_shards_fill_rows_and_check_shapes():
    lin = PackedLinear(3, {"q": 2, "k": 1}, bias=True)
    lin.load_shard("k", "weight", torch.full((1, 3), 7.0))
    lin.load_shard("q", "bias", torch.tensor([1.0, 2.0]))
    assert torch.equal(lin.weight[2], torch.full((3,), 7.0))
    assert torch.equal(lin.bias[:2], torch.tensor([1.0, 2.0]))
    with pytest.raises(ModelLoadError, match="shard q.weight"):
        lin.load_shard("q", "weight", torch.zeros(3, 3))
