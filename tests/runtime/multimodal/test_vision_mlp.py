"""The vision tower's padded MLP keeps HF's parameter names and shapes while its storage is
padded: loading, dummy fills and dtype/device moves never write the padding, and the output
is the plain three-linear MLP's."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sgdsl.runtime.model.vision_mlp import VisionMLP

NAMES = ["down_proj.bias", "down_proj.weight", "gate_proj.bias", "gate_proj.weight",
         "up_proj.bias", "up_proj.weight"]


def _padding_is_zero(mlp: VisionMLP) -> bool:
    i, p = mlp.hidden, mlp.padded
    pads = (mlp.gate_up_weight[i:p], mlp.gate_up_weight[p + i:], mlp.gate_up_bias[i:p],
            mlp.gate_up_bias[p + i:], mlp.down_weight[:, i:])
    return all(float(t.abs().sum()) == 0.0 for t in pads)


def _plain(x: torch.Tensor, sd: dict, act) -> torch.Tensor:
    gate = F.linear(x, sd["gate_proj.weight"], sd["gate_proj.bias"])
    up = F.linear(x, sd["up_proj.weight"], sd["up_proj.bias"])
    return F.linear(act(gate) * up, sd["down_proj.weight"], sd["down_proj.bias"])


@pytest.mark.parametrize("act", ["silu", "quick_gelu"])
def test_loaded_weights_land_in_the_padded_storage(act):
    torch.manual_seed(0)
    mlp = VisionMLP(40, 90, act).to(torch.float64)  # 90 -> 128: padded
    assert mlp.padded == 128 and sorted(mlp.state_dict()) == NAMES
    assert mlp.gate_proj.weight.data_ptr() == mlp.gate_up_weight.data_ptr()  # shared after .to
    assert mlp.down_proj.weight.shape == (40, 90)
    sd = {k: torch.randn_like(v) for k, v in mlp.state_dict().items()}
    assert not mlp.load_state_dict(sd).missing_keys
    assert _padding_is_zero(mlp)
    x = torch.randn(7, 40, dtype=torch.float64)
    with torch.no_grad():
        assert float((mlp(x) - _plain(x, sd, mlp.act)).abs().max()) < 1e-12


def test_dummy_fill_leaves_the_padding_zero():
    from sgdsl.runtime.model.loader import fill_dummy_weights

    mlp = VisionMLP(32, 48, "silu")
    fill_dummy_weights(mlp, seed=1)
    assert _padding_is_zero(mlp) and float(mlp.gate_proj.weight.detach().abs().sum()) > 0
    assert float(mlp.gate_up_weight[:48].abs().sum()) > 0  # the fill went to the storage
