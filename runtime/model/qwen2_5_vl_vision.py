"""The Qwen2.5-VL vision transformer: patch embedding, 2-D rotary, window attention (full
attention in ``fullatt_block_indexes``), and the patch merger (2x2 patches -> one LLM token).

Parameter names follow the HF checkpoint under ``visual.`` (``patch_embed.proj``,
``blocks.N.{norm1,norm2,attn.qkv,attn.proj,mlp.{gate,up,down}_proj}``, ``merger.{ln_q,mlp.0,
mlp.2}``). Input: the image processor's flattened patches ``[patches, C*T*P*P]`` of several
images packed together and their ``grid_thw``; output: ``[tokens, out_hidden]`` in the
images' order. Attention runs over ragged segments (windows or whole frames, contiguous in the
window order): one varlen flash call per layer on the GPU, one SDPA call per segment length
elsewhere (``vision_attention.py``). The residual stream is carried beside each block's output
so every add is fused into the next norm (``RMSNorm(x, residual)``), the merger's included;
the MLP runs zero-padded to aligned GEMMs (``vision_mlp.py``).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.dispatch import use_triton
from ..layers.norm import RMSNorm  # HF's Qwen2RMSNorm; one fused kernel on the GPU
from ..layers.upload import to_device
from .vision_attention import Segments, segment_attention, varlen_supported
from .vision_mlp import VisionMLP

EPS = 1e-6
Rope = tuple[torch.Tensor, torch.Tensor]


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """rotate-half rotary in fp32 (as HF's ``apply_rotary_pos_emb_vision``); on the GPU one
    kernel (fp32 inside) instead of ~8 passes over the activations."""
    if use_triton(x):
        from ..kernels.rotary import rotary_apply_gathered

        return rotary_apply_gathered(x, cos, sin)  # reads sin's second half: +sin, as here
    dtype = x.dtype
    x = x.float()
    x1, x2 = x.chunk(2, dim=-1)
    return (x * cos + torch.cat((-x2, x1), dim=-1) * sin).to(dtype)


class VisionAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, segs: Segments, rope: Rope) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.heads, self.head_dim).unbind(1)
        q, k = _rotate(q, *rope), _rotate(k, *rope)
        out = segment_attention(q, k, v, segs, self.head_dim ** -0.5)
        return self.proj(out.reshape(n, -1))


class VisionBlock(nn.Module):
    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.norm1 = RMSNorm(cfg.hidden_size, EPS)
        self.norm2 = RMSNorm(cfg.hidden_size, EPS)
        self.attn = VisionAttention(cfg.hidden_size, cfg.num_heads)
        self.mlp = VisionMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, segs: Segments,
                rope: Rope) -> tuple[torch.Tensor, torch.Tensor]:
        """The hidden state is ``x + residual`` (``x`` alone for the first block); returns the
        MLP's output and the residual it is to be added to (by the next norm)."""
        h, residual = (self.norm1(x), x) if residual is None else self.norm1(x, residual)
        h, residual = self.norm2(self.attn(h, segs, rope), residual)  # fused: + attn, norm
        return self.mlp(h), residual


class PatchMerger(nn.Module):
    def __init__(self, out_dim: int, dim: int, merge: int) -> None:
        super().__init__()
        self.hidden = dim * merge * merge
        self.ln_q = RMSNorm(dim, EPS)
        self.mlp = nn.Sequential(nn.Linear(self.hidden, self.hidden), nn.GELU(),
                                 nn.Linear(self.hidden, out_dim))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """Merges the hidden state ``x + residual`` (the last block's add, fused here)."""
        return self.mlp(self.ln_q(x, residual)[0].view(-1, self.hidden))


class PatchEmbed(nn.Module):
    """Conv3d with stride == kernel: one matmul over each flattened (C, T, P, P) patch."""

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        kernel = (cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
        self.proj = nn.Conv3d(cfg.in_channels, cfg.hidden_size, kernel, stride=kernel, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.proj.weight
        return F.linear(x.to(w.dtype), w.view(w.shape[0], -1))


class Qwen2_5_VisionTransformer(nn.Module):
    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.merge = cfg.spatial_merge_size
        self.unit = self.merge ** 2
        self.window = cfg.window_size // self.merge // cfg.patch_size  # in merged units
        self.full_blocks = set(cfg.fullatt_block_indexes)
        self.patch_embed = PatchEmbed(cfg)
        head_dim = cfg.hidden_size // cfg.num_heads
        theta = float((getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0))
        quarter = torch.arange(0, head_dim // 2, 2, dtype=torch.float) / (head_dim // 2)
        # NOTE: not a buffer: it stays fp32 on the host when the module moves to bf16
        self.inv_freq = (1.0 / theta ** quarter).cpu()
        self.blocks = nn.ModuleList(VisionBlock(cfg) for _ in range(cfg.depth))
        self.merger = PatchMerger(cfg.out_hidden_size, cfg.hidden_size, self.merge)

    @property
    def dtype(self) -> torch.dtype:
        return self.patch_embed.proj.weight.dtype

    def forward(self, pixels: torch.Tensor, grids: list[tuple[int, int, int]]) -> torch.Tensor:
        # NOTE: host tensors go up pinned and non-blocking (layers/upload.py): a plain copy
        # would hold the host until the device drained the work queued before this forward
        device = pixels.device
        order, window_lens = self.window_index(grids)
        order = to_device(order, device)
        x = self._by_unit(self.patch_embed(pixels), order)
        angles = self._by_unit(self.rope_angles(to_device(self.patch_positions(grids), device)),
                               order)
        emb = torch.cat((angles, angles), dim=-1)
        rope = (emb.cos()[:, None, :], emb.sin()[:, None, :])
        # full attention: each frame of each image on its own
        frames = torch.tensor([h * w for t, h, w in grids for _ in range(t)])
        varlen = varlen_supported(device, self.dtype)
        full = Segments.of(frames, device, varlen)
        windows = Segments.of(window_lens, device, varlen)
        residual = None
        for i, block in enumerate(self.blocks):
            x, residual = block(x, residual, full if i in self.full_blocks else windows, rope)
        return self.merger(x, residual)[torch.argsort(order)]

    def _by_unit(self, x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
        """Reorder rows by merge unit (2x2 patches stay together) into window order."""
        return x.view(-1, self.unit, x.shape[-1])[order].reshape(-1, x.shape[-1])

    def patch_positions(self, grids: list[tuple[int, int, int]]) -> torch.Tensor:
        """``[patches, 2]`` (row, column) of each patch, in the processor's patch order (merge
        blocks row-major, patches row-major inside a block)."""
        m, out = self.merge, []
        for t, h, w in grids:
            rows = torch.arange(h).view(h // m, m, 1, 1).expand(h // m, m, w // m, m)
            cols = torch.arange(w).view(1, 1, w // m, m).expand(h // m, m, w // m, m)
            rows, cols = rows.transpose(1, 2).flatten(), cols.transpose(1, 2).flatten()
            out.append(torch.stack([rows, cols], dim=-1).repeat(t, 1))
        return torch.cat(out)

    def rope_angles(self, positions: torch.Tensor) -> torch.Tensor:
        """``[patches, head_dim / 2]`` fp32: the row angles, then the column angles."""
        pos = positions.float()
        inv = to_device(self.inv_freq, pos.device)  # 20 floats; pageable: waits for the queue
        return torch.cat([pos[:, :1] * inv, pos[:, 1:] * inv], dim=-1)

    def window_index(self, grids: list[tuple[int, int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Merge units reordered window by window, and each window's patch count."""
        size, order, lens, base = self.window, [], [], 0
        for t, h, w in grids:
            gh, gw = h // self.merge, w // self.merge
            index = torch.arange(t * gh * gw).view(t, gh, gw)
            ph, pw = -gh % size or size, -gw % size or size  # as HF: a full pad when divisible
            padded = F.pad(index, (0, pw, 0, ph), value=-1)
            nh, nw = (gh + ph) // size, (gw + pw) // size
            windows = padded.view(t, nh, size, nw, size).permute(0, 1, 3, 2, 4).reshape(-1, size * size)
            kept = windows >= 0
            order.append(windows[kept] + base)  # row-major: window after window
            counts = kept.sum(1)
            lens.append(counts[counts > 0] * self.unit)
            base += t * gh * gw
        return torch.cat(order), torch.cat(lens)
