"""HiddenCapture: the target's hidden states, kept per KV slot, for EAGLE drafters.

An EAGLE head drafts from the target's hidden states (EAGLE: the last layer's output after the
final norm; EAGLE3: the residual stream entering three layers, concatenated). Installed on the
target model (the ``# spec:`` hook in ``llama.py``'s ``LlamaModel.forward``), every target
forward (prefill chunks, verify, plain decode) writes each new token's states at the token's
KV slot, next to its KV. So the states of any position with KV can be read through the
request's ``req_to_token`` row, including a radix-cache hit (the same tokens at the same
positions computed the same states) and verified tree nodes (moved in the table, never in the
pool). Nothing is recorded per request, so nothing needs freeing.

Memory: ``width`` values per target KV slot (EAGLE3 on Llama-3.1-8B: 24 KiB against 128 KiB of
KV per token in bf16).
"""
from __future__ import annotations

from typing import Any

import torch

FINAL = -1  # capture point: the model's output (after the final norm)


class HiddenCapture:
    def __init__(self, points: tuple[int, ...], hidden_size: int, num_slots: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        """``points``: ``FINAL``, or layer indices whose input (the residual stream entering
        the layer; the number of layers: the last layer's output before the norm) is kept."""
        self.points = points
        self.hidden_size = hidden_size
        # capture point -> the buffers it fills (a point may repeat on shallow models)
        self._at = {p: [k for k, q in enumerate(points) if q == p] for p in set(points)}
        # slot 0 is the pool's dummy row (padded CUDA-graph rows write there)
        self.buffers = [torch.zeros(num_slots + 1, hidden_size, dtype=dtype, device=device)
                        for _ in points]

    @property
    def width(self) -> int:
        return self.hidden_size * len(self.points)

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
        parts = [b.index_select(0, slots) for b in self.buffers]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    def _write(self, point: int, x: torch.Tensor, loc: torch.Tensor) -> None:
        for k in self._at[point]:
            buf = self.buffers[k]
            buf.index_copy_(0, loc, x.to(buf.dtype))

    def forward(self, model: Any, batch: Any, attn: Any) -> torch.Tensor:
        """``LlamaModel.forward`` with the captures (same layers, same order, same result)."""
        loc = batch.out_cache_loc
        h = model.embed_tokens(batch.input_ids)
        rope = model.rotary_emb.lookup(batch.positions)
        residual = None
        for i, layer in enumerate(model.layers):
            if i in self._at:
                self._write(i, h if residual is None else h + residual, loc)
            h, residual = layer(h, residual, rope, batch, attn)
        if len(model.layers) in self._at:
            self._write(len(model.layers), h if residual is None else h + residual, loc)
        out = model.norm(h) if residual is None else model.norm(h, residual)[0]
        if FINAL in self._at:
            self._write(FINAL, out, loc)
        return out
