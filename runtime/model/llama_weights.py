"""Loading a checkpoint into the Llama family (``LlamaForCausalLM`` and the models built on it):
checkpoint names onto our packed projections, each tensor through its parameter's
``weight_loader`` (this rank's slice only), calibrated fp8 KV-cache scales, and which
parameters a checkpoint left unfilled."""
from __future__ import annotations

import re
from typing import Any, Iterable

from torch import nn

from ..distributed import pipeline_model
from ..errors import ModelLoadError
from ..layers.linear import MergedColumnParallelLinear
from ..layers.weight_slices import copy_checked, materialize

_KV_SCALE = re.compile(r"^model\.layers\.(\d+)\.self_attn\.(?:attn\.)?([kv])_scale$")
# checkpoint name fragment -> (our packed module fragment, shard)
_PACKED = {".q_proj.": (".qkv_proj.", "q"), ".k_proj.": (".qkv_proj.", "k"),
           ".v_proj.": (".qkv_proj.", "v"), ".gate_proj.": (".gate_up_proj.", "gate"),
           ".up_proj.": (".gate_up_proj.", "up")}


class LlamaWeights:
    """The checkpoint-loading half of ``LlamaForCausalLM`` (a mixin: it uses the model's
    ``config``, ``model.stage``, ``lm_head`` and ``kv_cache_scales``)."""

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> set[str]:
        """Copy checkpoint tensors (torch tensors or lazy safetensors slices) into our
        parameters, each through its ``weight_loader`` (which reads only this rank's slice);
        returns the names of parameters touched (a packed one counts once all its shards
        arrive, see ``missing_weights``)."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        tied = self.config.tie_word_embeddings
        for name, tensor in weights:
            if "rotary_emb." in name or (self.lm_head is None and name.startswith("lm_head.")):
                continue  # derived buffers; a tied head shares the embedding
            if not pipeline_model.owns_weight(self.model.stage, name, tied):
                continue  # pp: another stage's (never read)
            loaded |= self.load_one(name, tensor, params)
        return loaded

    def load_one(self, name: str, tensor: Any, params: dict[str, nn.Parameter]) -> set[str]:
        """Load one checkpoint tensor; the names it filled (``param[:shard]``)."""
        kv = _KV_SCALE.match(name)
        if kv is not None:  # calibrated fp8 KV-cache scales (used with kv_cache_dtype=fp8_e4m3)
            layer, which = int(kv.group(1)), kv.group(2)
            k, v = self.kv_cache_scales.get(layer, (1.0, 1.0))
            value = float(materialize(tensor).float().reshape(-1)[0])
            self.kv_cache_scales[layer] = (value, v) if which == "k" else (k, value)
            return {name}
        if name.endswith(".input_scale"):
            return set()  # static activation scales: activations are quantized per token
        target = _packed_target(name)
        if target is not None:
            ours, shard = target
            if ours not in params:
                raise ModelLoadError(f"weight {name}: the model has no {ours}")
            params[ours].weight_loader(params[ours], tensor, shard)
            return {f"{ours}:{shard}"}
        if name not in params:
            return set()  # e.g. extra heads some checkpoints carry; not ours to use
        load_param(params[name], tensor, name)
        return {name}

    def missing_weights(self, loaded: set[str]) -> list[str]:
        """Parameters (or packed shards) that ``load_weights`` never filled."""
        return unloaded_params(self, loaded)


def unloaded_params(model: nn.Module, loaded: set[str]) -> list[str]:
    """``model``'s parameters (a packed projection's: each shard, ``name:shard``) not in
    ``loaded``."""
    missing = []
    for name, module in model.named_modules():
        for pname, _ in module.named_parameters(recurse=False):
            full = f"{name}.{pname}" if name else pname
            if isinstance(module, MergedColumnParallelLinear):
                missing += [f"{full}:{s}" for s in module.offsets if f"{full}:{s}" not in loaded]
            elif full not in loaded:
                missing.append(full)
    return missing


def _packed_target(name: str) -> tuple[str, str] | None:
    for fragment, (packed, shard) in _PACKED.items():
        if fragment in name:
            return name.replace(fragment, packed), shard
    return None


def load_param(param: nn.Parameter, tensor: Any, name: str) -> None:
    """Through the parameter's ``weight_loader`` (this rank's slice), or whole (replicated)."""
    loader = getattr(param, "weight_loader", None)
    if loader is not None:
        loader(param, tensor)
    else:
        copy_checked(param.data, tensor, f"weight {name}")
