"""HiddenCapture: the target's hidden states, kept per KV slot, for EAGLE drafters.

An EAGLE head drafts from the target's hidden states (EAGLE: the last layer's output after the
final norm; EAGLE3: the residual stream entering three layers, concatenated). Installed on the
target model (the ``# spec:`` hook in ``llama.py``'s ``LlamaModel.forward``), every target
forward (prefill chunks, verify, plain decode) writes each new token's state at the token's
KV slot, next to its KV. So the state of any position with KV can be read through the
request's ``req_to_token`` row, including a radix-cache hit (the same tokens at the same
positions computed the same states) and verified tree nodes (moved in the table, never in the
pool). Nothing is recorded per request, so nothing needs freeing.

``project``: applied to the (concatenated) states before they are stored. EAGLE3's head starts
with a linear ``fc`` over its three target layers; applying it here (exact: it is the same
product, once per token) stores one hidden size per slot instead of three.

Memory: one hidden size per target KV slot (Llama-3.1-8B: 8 KiB against 128 KiB of KV per
token in bf16).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..errors import ModelLoadError

FINAL = -1  # capture point: the model's output (after the final norm)


class HiddenCapture:
    def __init__(self, points: tuple[int, ...], width: int, num_slots: int, dtype: torch.dtype,
                 device: torch.device, project: Callable[[torch.Tensor], torch.Tensor] | None = None
                 ) -> None:
        """``points``: ``FINAL``, or layer indices whose input (the residual stream entering
        the layer; the number of layers: the last layer's output before the norm) is kept, in
        this order; ``width``: the stored size per token (after ``project``)."""
        self.points = points
        self.project = project
        need = (num_slots + 1) * width * torch.empty((), dtype=dtype).element_size()
        if torch.device(device).type == "cuda" and need > torch.cuda.mem_get_info(device)[0]:
            raise ModelLoadError(
                f"EAGLE hidden-state store needs {need / 2**30:.1f} GiB for {num_slots} KV slots; "
                "lower mem_fraction_static or max_total_tokens to leave room for it")
        # slot 0 is the pool's dummy row (padded CUDA-graph rows write there)
        self.buffer = torch.zeros(num_slots + 1, width, dtype=dtype, device=device)

    def install(self, runner: Any) -> None:
        """Hook into the target ``runner``'s model. The CPU decoder's flat path bypasses the
        model's forward, so it is turned off; captured decode graphs are captured again with
        the hook in them."""
        runner.model.model.spec_capture = self
        runner.cpu_decoder = None
        if runner.cuda_graph_runner is not None:
            runner.cuda_graph_runner = runner._init_cuda_graphs()

    def read(self, slots: torch.Tensor) -> torch.Tensor:
        """``[len(slots), width]``: the states kept at target KV ``slots`` (device tensor)."""
        return self.buffer.index_select(0, slots)

    def forward(self, model: Any, batch: Any, attn: Any) -> torch.Tensor:
        """``LlamaModel.forward`` with the captures (same layers, same order, same result)."""
        seen: dict[int, torch.Tensor] = {}
        h = model.embed_tokens(batch.input_ids)
        rope = model.rotary_emb.lookup(batch.positions)
        residual = None
        for i, layer in enumerate(model.layers):
            if i in self.points:
                seen[i] = h if residual is None else h + residual
            h, residual = layer(h, residual, rope, batch, attn)
        seen[len(model.layers)] = h if residual is None else h + residual
        out = model.norm(h) if residual is None else model.norm(h, residual)[0]
        seen[FINAL] = out
        states = [seen[p] for p in self.points]
        x = states[0] if len(states) == 1 else torch.cat(states, dim=-1)
        if self.project is not None:
            x = self.project(x.to(self.buffer.dtype))
        self.buffer.index_copy_(0, batch.out_cache_loc, x.to(self.buffer.dtype))
        return out
