"""Pipeline parallelism (``EngineConfig.pp_size``, SGLang's ``--pp-size``): the decoder layers
split into ``pp_size`` contiguous ranges (stages), each stage a tensor-parallel group of
``tp_size`` ranks holding only its layers' weights and KV.

Stage ``s`` of ``p`` runs layers ``layer_range(L, p, s)``; the first stage also embeds the
tokens, the last applies the final norm and the lm_head and samples. A stage's output (hidden
states and the residual, ``[tokens, 2, hidden]``) goes to the next stage by point-to-point
send/recv over the world group (gloo on CPU, NCCL on GPU): TP rank t of stage s sends to TP
rank t of stage s + 1 (both hold the full, all-reduced hidden states).

Every rank of every stage runs the same scheduler over the same messages (as under TP, see
docs/tensor_parallel.md), so every stage builds the same batches and reads and writes the same
KV slot numbers in its own pool (its layers only). The sampled ids are broadcast from rank 0
to the whole world (``collectives.broadcast``); rank 0 sits on the last stage
(``state.stage_ranks``), where the logits are. This module: the layout and the transfers;
``pipeline_model.py`` cuts the model, ``pipeline_runner.py`` runs one stage's forward.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..errors import ModelLoadError
from .state import get_tp_group, get_world_group, pp_place


@dataclass(frozen=True)
class PipelineStage:
    """This rank's stage: which layers it runs and who it exchanges hidden states with."""

    rank: int = 0  # the stage index, 0 = the embedding's
    size: int = 1  # pp_size
    start: int = 0  # first layer of the stage
    end: int = 0  # one past its last layer
    num_layers: int = 0  # of the whole model

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    @property
    def is_last(self) -> bool:
        return self.rank == self.size - 1

    @property
    def num_stage_layers(self) -> int:
        return self.end - self.start

    def owns_layer(self, layer: int) -> bool:
        return self.start <= layer < self.end

    def needs_embedding(self, tied: bool) -> bool:
        """The first stage embeds; with tied embeddings the last computes logits with it."""
        return self.is_first or (tied and self.is_last)


def layer_range(num_layers: int, pp_size: int, stage: int) -> tuple[int, int]:
    """Contiguous layers ``[start, end)`` of ``stage``. An uneven split gives the extra layers
    to the first stages: the last one also computes the final norm, the logits and sampling."""
    base, extra = divmod(num_layers, pp_size)
    start = stage * base + min(stage, extra)
    return start, start + base + (stage < extra)


def check_layers(num_layers: int, pp_size: int) -> None:
    """Every stage needs at least one layer."""
    if pp_size > num_layers:
        raise ModelLoadError(f"pp_size={pp_size} exceeds the model's {num_layers} layers: every "
                             "pipeline stage needs at least one layer")


# Architectures whose model runs its layers through ``LlamaModel.forward`` (the stage loop);
# the multimodal models replace that loop (image embeddings) and run at pp_size 1 only.
PP_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                    "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM")


def check_architecture(architecture: str, pp_size: int) -> None:
    if pp_size > 1 and architecture not in PP_ARCHITECTURES:
        raise ModelLoadError(f"pp_size={pp_size}: {architecture} does not run over pipeline "
                             f"stages yet (supported: {', '.join(PP_ARCHITECTURES)})")


def current_stage(num_layers: int) -> PipelineStage:
    """This process's stage for a model of ``num_layers`` layers (all of them at pp_size 1)."""
    stage, size = pp_place()
    check_layers(num_layers, size)
    start, end = layer_range(num_layers, size, stage)
    return PipelineStage(stage, size, start, end, num_layers)


def _peer(offset: int) -> int:
    """Global rank of the same TP rank ``offset`` stages later (stages count down, see
    ``state.stage_ranks``)."""
    return get_world_group().rank - offset * get_tp_group().size


def send_next(x: torch.Tensor) -> Any:
    """Start sending this stage's output to the next stage; returns the request (``wait()``
    it before ``x`` may change; on the GPU the send runs on NCCL's stream)."""
    import torch.distributed as dist

    return dist.isend(x.contiguous(), dst=_peer(1), group=get_world_group().group)


def recv_prev(shape: tuple[int, ...], dtype: torch.dtype,
              device: torch.device) -> tuple[torch.Tensor, Any]:
    """Start receiving the previous stage's output for a batch of ``shape`` (every stage knows
    it: the same scheduler built the same batch on every rank): (buffer, request to
    ``wait()`` on before reading the buffer)."""
    import torch.distributed as dist

    buf = torch.empty(shape, dtype=dtype, device=device)
    return buf, dist.irecv(buf, src=_peer(-1), group=get_world_group().group)


def pack(h: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
    """A stage's output ``[tokens, 2, hidden]``: the layer output and the residual stream (their
    sum is the next layer's input; a fused layer leaves no separate residual: zeros)."""
    if residual is None:
        residual = torch.zeros_like(h)
    return torch.stack((h, residual), dim=1)


def unpack(proxy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``pack``'s inverse, as contiguous tensors (the norms write the residual in place)."""
    return proxy[:, 0].contiguous(), proxy[:, 1].contiguous()
