"""Weight loading shared by the MoE decoders: expert tensors go into their layer's fused
expert weights (this rank's slice), everything else through the dense model's loader."""
from __future__ import annotations

import torch
from torch import nn

from ..layers.moe.layer import FusedMoE
from .sparse_moe import expert_tensor


class MoEForCausalLMMixin:
    # (checkpoint fragment, our fragment) applied to every tensor name first
    checkpoint_renames: tuple[tuple[str, str], ...] = ()

    def load_one(self, name: str, tensor: torch.Tensor, params: dict[str, nn.Parameter]
                 ) -> set[str]:
        for theirs, ours in self.checkpoint_renames:
            name = name.replace(theirs, ours)
        parsed = expert_tensor(name)
        if parsed is None:
            return super().load_one(name, tensor, params)
        module_name, expert, shard, kind = parsed
        experts = self.get_submodule(module_name)
        assert isinstance(experts, FusedMoE), module_name
        experts.load_expert(expert, shard, kind, tensor)
        return {f"{module_name}:{expert}.{shard}.{kind}"}

    def missing_weights(self, loaded: set[str]) -> list[str]:
        """Dense parameters as in the base model; each expert's gate/up/down weights."""
        missing = [m for m in super().missing_weights(loaded)
                   if ".experts." not in m or not _is_expert_param(m)]
        for name, module in self.named_modules():
            if isinstance(module, FusedMoE):
                missing += [f"{name}:{e}.{s}.weight" for e in range(module.num_experts)
                            for s in ("gate", "up", "down")
                            if f"{name}:{e}.{s}.weight" not in loaded]
        return missing


def _is_expert_param(name: str) -> bool:
    return name.rsplit(".", 1)[-1].startswith(("w13_", "w2_"))
