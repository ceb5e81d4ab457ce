"""Batch-1 matrix-vector products whose next op pairs output rows, with that op as the
epilogue: one launch where there were two.

- ``gemv_silu``: the packed ``[gate | up]`` projection of a SwiGLU MLP; row ``i`` and row
  ``i + I`` make ``silu(gate_i) * up_i`` (the ``silu_and_mul`` kernel's work).
- ``gemv_rope``: the packed ``qkv`` projection; rows ``j`` and ``j + head_dim / 2`` of a q or k
  head are rotated together (neox rotary, ``qk_norm_rope``'s work without norms), and with a
  ``KVStoreTarget`` the rotated k and the v heads are written to the KV pool.

Each program owns ``BLOCK_P`` pairs: two weight rows per pair, streamed as ``gemv.py`` streams
one (16-byte vectors, x loaded once per block in the weights' register layout and used for both
rows, row sums reduced after the loop). A tile ``(BLOCK_P, BLOCK_K in weight bytes, warps)``
with one pair is ``gemv.py``'s two-row tile; the sweep of 2026-11-24 (H100, 32-layer chains)
found one and two rows a program within 2% of each Llama-3.1-8B shape's best.

Rounding is the separate kernels': each product rounded to x's dtype (then + bias, rounded),
silu(gate) rounded before the product with up, the rotation in fp32 rounded once, an fp8 pool
storing the rounded k (or v) divided by its scale, clamped to E4M3's range.

PDL (``pdl.py``): the weights' first blocks (``SGDSL_GEMV_PAIRS_PRE``, default 2,
``pdl.pre_blocks``), the scales and the biases are read before the wait for the previous kernel
(parameters only), cos/sin, the slot and x after it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl
from .gemv import Tile, _load_w, _load_x, _pre_blocks
from .kv_store import store_halves

SILU, ROPE = 0, 1


def default_pair_tile(n: int, elem: int) -> Tile:
    """One pair (two rows) a program, 64 weight bytes a thread per block for fp8 and 32 for
    2-byte weights (as ``gemv.default_tile``); 1 KB blocks of fp8 / 2 KB of bf16 per row for up
    to 16k rows (qkv), twice the block and the warps above (gate_up). NOTE: the best of 5 tiles
    per shape in 32-layer chains (``sweep_gemv_pairs.py``, H100, 2026-11-26, us per layer):
    qkv fp8 (1, 1024, 1) 10.59 (separate kernels 11.89), gate_up fp8 (1, 2048, 2) 39.72 (1 KB
    1 warp 40.21, separate 41.26), qkv bf16 (1, 2048, 4) 18.71 (19.61), gate_up bf16 (1, 4096,
    8) 75.86 (2 KB 4 warps 76.66, separate 77.06). 128 fp8 bytes a thread, (1, 2048, 1), took
    255 registers (Triton 3.9's SASS for sm_90) and 11.60 / 40.49 us."""
    wide = n > 16384
    if elem >= 2:
        return (1, 4096, 8) if wide else (1, 2048, 4)
    return (1, 2048, 2) if wide else (1, 1024, 1)


@triton.jit
def _rows(offs_p, n_pairs, HALF: tl.constexpr, EPILOGUE: tl.constexpr):
    """The two weight rows of each pair."""
    if EPILOGUE == 1:  # rope: rows j and j + HALF of head p // HALF
        a = (offs_p // HALF) * (2 * HALF) + offs_p % HALF
        b = a + HALF
    else:  # silu: gate row i and up row i
        a = offs_p
        b = offs_p + n_pairs
    return a, b


@triton.jit
def _row_consts(S, Bias, rows, mask_p, HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr):
    """The rows' scales and biases (fp32; 1 and 0 where absent)."""
    scale = tl.full(rows.shape, 1.0, tl.float32)
    bias = tl.zeros(rows.shape, tl.float32)
    if HAS_SCALE:
        scale = tl.load(S + rows, mask=mask_p, other=0.0)
    if HAS_BIAS:
        bias = tl.load(Bias + rows, mask=mask_p, other=0.0).to(tl.float32)
    return scale, bias


@triton.jit
def _finish(acc, scale, bias, rstd, dt: tl.constexpr, HAS_SCALE: tl.constexpr,
            HAS_BIAS: tl.constexpr):
    """Row sums -> the product's values in ``dt``, rounded as the unfused ops round."""
    out = tl.sum(acc, axis=1) * rstd
    if HAS_SCALE:
        out = out * scale
    out = out.to(dt)
    if HAS_BIAS:
        out = (out.to(tl.float32) + bias).to(dt)
    return out.to(tl.float32)


@triton.jit
def _pairs_kernel(X, W, S, Out, NW, Bias, Cos, Sin, K_Buf, V_Buf, Loc, n_pairs, K, stride_wn,
                  eps, q_heads, kv_heads, stride_kbs, stride_vbs, inv_k_scale, inv_v_scale,
                  EPILOGUE: tl.constexpr, HALF: tl.constexpr, HAS_SCALE: tl.constexpr,
                  NORM: tl.constexpr, HAS_BIAS: tl.constexpr, STORE: tl.constexpr,
                  QUANT: tl.constexpr, EVEN_P: tl.constexpr, EVEN_K: tl.constexpr,
                  BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr, VEC: tl.constexpr,
                  PRE: tl.constexpr, PDL: tl.constexpr):
    offs_p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    mask_p = offs_p < n_pairs
    row_a, row_b = _rows(offs_p, n_pairs, HALF, EPILOGUE)
    # NOTE: the epilogue's loads first, so they are in flight with the weights' (after the
    # loop they would add a round trip to every program's end)
    scale_a, bias_a = _row_consts(S, Bias, row_a, mask_p, HAS_SCALE, HAS_BIAS)
    scale_b, bias_b = _row_consts(S, Bias, row_b, mask_p, HAS_SCALE, HAS_BIAS)
    offs_k = (tl.arange(0, BLOCK_K // VEC)[:, None] * VEC + tl.arange(0, VEC)[None, :])
    pa = W + row_a[:, None, None].to(tl.int64) * stride_wn + offs_k[None, :, :]
    pb = W + row_b[:, None, None].to(tl.int64) * stride_wn + offs_k[None, :, :]
    even: tl.constexpr = EVEN_P and EVEN_K
    if PDL:  # weights, scales and biases before the wait (pdl.py); cos, sin, slot and x after
        was = _pre_blocks(pa, mask_p[:, None, None], offs_k, K, PRE, BLOCK_K, even)
        wbs = _pre_blocks(pb, mask_p[:, None, None], offs_k, K, PRE, BLOCK_K, even)
        pa += PRE * BLOCK_K
        pb += PRE * BLOCK_K
        pdl.enter(PDL)
    j = offs_p % HALF
    if EPILOGUE == 1:
        cos = tl.load(Cos + j, mask=mask_p, other=1.0).to(tl.float32)
        sin = tl.load(Sin + HALF + j, mask=mask_p, other=0.0).to(tl.float32)
        if STORE:
            slot = tl.load(Loc).to(tl.int64)
    acc_a = tl.zeros((BLOCK_P, BLOCK_K // VEC), dtype=tl.float32)
    acc_b = tl.zeros((BLOCK_P, BLOCK_K // VEC), dtype=tl.float32)
    sq = tl.zeros((1, BLOCK_K // VEC, VEC), dtype=tl.float32)
    k_first = 0
    if PDL:  # the loop's first PRE steps, the same sums in order
        for i in tl.static_range(PRE):
            x, x_sq = _load_x(X, NW, i * BLOCK_K, K, offs_k, offs_p, NORM, EVEN_K)
            if NORM:
                sq += x_sq
            acc_a += tl.sum(was[i].to(tl.float32) * x, axis=2)
            acc_b += tl.sum(wbs[i].to(tl.float32) * x, axis=2)
        k_first = PRE * BLOCK_K
    for k0 in range(k_first, K, BLOCK_K):
        mask_w = mask_p[:, None, None] & (offs_k[None, :, :] < K - k0)
        wa = _load_w(pa, mask_w, even)
        wb = _load_w(pb, mask_w, even)
        pa += BLOCK_K
        pb += BLOCK_K
        x, x_sq = _load_x(X, NW, k0, K, offs_k, offs_p, NORM, EVEN_K)
        if NORM:  # RMSNorm folded in: 1 / rms(x) applied after the loop
            sq += x_sq
        acc_a += tl.sum(wa.to(tl.float32) * x, axis=2)
        acc_b += tl.sum(wb.to(tl.float32) * x, axis=2)
    rstd = 1.0
    if NORM:
        rstd = 1.0 / tl.sqrt(tl.sum(tl.sum(tl.sum(sq, axis=2), axis=1), axis=0) / K + eps)
    dt: tl.constexpr = Out.dtype.element_ty
    a = _finish(acc_a, scale_a, bias_a, rstd, dt, HAS_SCALE, HAS_BIAS)
    b = _finish(acc_b, scale_b, bias_b, rstd, dt, HAS_SCALE, HAS_BIAS)
    if EPILOGUE == 0:  # silu(gate), rounded, times up (silu_and_mul's rounding)
        act = (a / (1.0 + tl.exp(-a))).to(dt).to(tl.float32)
        tl.store(Out + offs_p, (act * b).to(dt), mask=mask_p)
    else:
        head = offs_p // HALF
        rot = head < q_heads + kv_heads  # q and k heads rotate, v heads pass through
        o1 = tl.where(rot, a * cos - b * sin, a).to(dt)
        o2 = tl.where(rot, b * cos + a * sin, b).to(dt)
        tl.store(Out + row_a, o1, mask=mask_p)
        tl.store(Out + row_b, o2, mask=mask_p)
        if STORE:
            store_halves(K_Buf, slot, stride_kbs, head - q_heads, j, o1, o2,
                        mask_p & rot & (head >= q_heads), inv_k_scale, HALF, QUANT)
            store_halves(V_Buf, slot, stride_vbs, head - q_heads - kv_heads, j, o1, o2,
                        mask_p & (head >= q_heads + kv_heads), inv_v_scale, HALF, QUANT)


def _check_gemv(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None,
                norm_w: torch.Tensor | None, bias: torch.Tensor | None) -> None:
    n, k = w.shape
    assert x.dim() == 2 and x.shape[0] == 1, "one row"
    assert x.shape[1] == k and x.stride(1) == 1 and w.stride(1) == 1 and n % 2 == 0
    if scale is not None:
        assert scale.shape == (n,) and scale.dtype == torch.float32 and scale.stride(0) == 1
    assert norm_w is None or (norm_w.numel() == k and norm_w.is_contiguous()), "norm weight"
    assert bias is None or (bias.numel() == n and bias.is_contiguous()), "bias"


def _launch(epilogue: int, x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None,
            out: torch.Tensor, tile: Tile | None, norm: tuple[torch.Tensor, float] | None,
            bias: torch.Tensor | None, half: int = 1, rope: tuple = (None, None),
            heads: tuple[int, int] = (0, 0), store=None) -> torch.Tensor:
    norm_w, eps = norm if norm is not None else (None, 0.0)
    _check_gemv(x, w, scale, norm_w, bias)
    n, k = w.shape
    pairs_per, block_bytes, warps = tile or default_pair_tile(n, w.element_size())
    block_k = block_bytes // w.element_size()
    cos, sin = (t if t is not None else w for t in rope)
    if store is not None:
        k_buf, v_buf, loc = store.k_buf, store.v_buf, store.loc
        inv = 1.0 / store.k_scale, 1.0 / store.v_scale
        assert k_buf.shape[1:] == v_buf.shape[1:] == (heads[1], 2 * half) and loc.numel() == 1
        assert k_buf.stride(1) == v_buf.stride(1) == 2 * half and k_buf.dtype == v_buf.dtype
        assert k_buf.stride(2) == v_buf.stride(2) == 1
    else:
        k_buf = v_buf = loc = w  # placeholders: never read
        inv = 1.0, 1.0
    on = pdl.enabled(x)
    _pairs_kernel[(triton.cdiv(n // 2, pairs_per),)](
        x, w, scale if scale is not None else w, out, norm_w if norm_w is not None else w,
        bias if bias is not None else w, cos, sin, k_buf, v_buf, loc, n // 2, k, w.stride(0),
        eps, heads[0], heads[1], k_buf.stride(0), v_buf.stride(0), *inv,
        EPILOGUE=epilogue, HALF=half, HAS_SCALE=scale is not None, NORM=norm is not None,
        HAS_BIAS=bias is not None, STORE=store is not None,
        QUANT=store is not None and k_buf.dtype == torch.float8_e4m3fn, EVEN_P=(n // 2) % pairs_per == 0,
        EVEN_K=k % block_k == 0, BLOCK_P=pairs_per, BLOCK_K=block_k, VEC=16 // w.element_size(),
        PRE=pdl.pre_blocks(k, block_k, on, "SGDSL_GEMV_PAIRS_PRE"), num_warps=warps,
        num_stages=1, **pdl.launch(on))
    return out


def gemv_silu(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None = None,
              tile: Tile | None = None, *, norm: tuple[torch.Tensor, float] | None = None,
              bias: torch.Tensor | None = None) -> torch.Tensor:
    """``silu_and_mul(x [1, K] @ w [2I, K]^T (+ bias))`` -> ``[1, I]`` in x's dtype; ``scale``,
    ``norm`` and ``bias`` as in ``gemv.gemv``."""
    out = torch.empty(1, w.shape[0] // 2, dtype=x.dtype, device=x.device)
    return _launch(SILU, x, w, scale, out, tile, norm, bias)


def gemv_rope(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, q_heads: int,
              kv_heads: int, cos: torch.Tensor, sin: torch.Tensor, store=None,
              tile: Tile | None = None, *, norm: tuple[torch.Tensor, float] | None = None,
              bias: torch.Tensor | None = None) -> torch.Tensor:
    """The qkv projection of one token, ``x [1, K] @ w [(q_heads + 2 * kv_heads) * D, K]^T (+
    bias)``, with its q and k heads rotated (neox layout) by ``cos``/``sin`` (one token's, as
    ``RotaryEmbedding.lookup`` returns them: ``[1, 1, D]``, sin's first half not read):
    ``[1, (q_heads + 2 * kv_heads) * D]``, v as projected. ``store`` (a ``KVStoreTarget``):
    the rotated k and the v heads also go to its buffers at its slot."""
    n = w.shape[0]
    head_dim = n // (q_heads + 2 * kv_heads)
    assert head_dim * (q_heads + 2 * kv_heads) == n and head_dim % 2 == 0
    cos2, sin2 = cos.reshape(-1), sin.reshape(-1)
    assert cos2.shape == sin2.shape == (head_dim,) and cos2.is_contiguous() and sin2.is_contiguous()
    out = torch.empty(1, n, dtype=x.dtype, device=x.device)
    return _launch(ROPE, x, w, scale, out, tile, norm, bias, head_dim // 2, (cos2, sin2),
                   (q_heads, kv_heads), store)
