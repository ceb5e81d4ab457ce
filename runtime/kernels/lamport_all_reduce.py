"""One-shot all-reduce without a barrier (Lamport-style), optionally fused with the residual add
and the RMSNorm that follow it in a decoder layer.

Every rank *pushes* its input into a slot of every peer's buffer (peer-to-peer stores over NVLink)
and then reads only its own buffer, spinning until every slot holds data: a slot's "empty" mark is
the bit pattern of -0.0 (0x8000), which no pushed element carries (-0.0 is sent as +0.0; the sum
is the same), so each element says by itself whether it has arrived and no signal-pad barrier is
needed. That barrier is where torch's one-shot kernel spends most of its ~10 us at decode sizes.

After reading, a rank marks its slots empty again. The buffer has two phases used alternately,
which is what makes the reset safe without a barrier: a peer can push into this rank's phase-p
slots again only in the call after next, and it reaches that call only after reading this rank's
push of the next call, which this rank makes after its own reads and resets (stream order).

Every call launches the same GRID programs; program ``i`` keeps its own call counter (so the
counters advance inside replayed CUDA graphs with no host value), and all programs of all ranks
agree on the phase because they advance together. Chunks of the message are dealt to programs
round robin; with the norm, a chunk is one row (the norm needs the whole row).

The wait loads every peer's slot of a chunk at once and spins until none is empty
(``SGDSL_LAMPORT_SPIN=serial``: one slot after another, as first written, which costs a
dependent round trip to memory per peer after the last one lands: ~3 at TP=4); with the
fused norm the residual and the norm's weight are loaded before the pushes, in flight during
the wait instead of one more round trip after it. The peer buffers' addresses are loaded
together and the pushes and spins move 16-byte vectors (``SGDSL_LAMPORT_VEC=0``: 2-byte
elements, as first compiled: the compiler cannot see that addresses read from memory are
aligned).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from . import pdl

EMPTY = -32768  # int16 view of bf16/fp16 -0.0
_EMPTY = tl.constexpr(EMPTY)
GRID = 32
PLAIN_CHUNK = 1024


def one_spin() -> bool:
    """Whether the wait spins on all peers' slots at once (``SGDSL_LAMPORT_SPIN``, default
    ``all``; ``serial``: one peer after another)."""
    return os.environ.get("SGDSL_LAMPORT_SPIN", "all").strip().lower() != "serial"


@triton.jit
def _arrived_serial(mine, first, slot, idx, mask, WORLD: tl.constexpr, BLOCK: tl.constexpr,
                    dt: tl.constexpr):
    """The sum over the WORLD slots from ``first`` on, spinning on one slot after another:
    at least one dependent round trip to memory per slot, even when all have arrived."""
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for p in tl.static_range(WORLD):  # the same order on every rank: identical sums
        src = mine + (first + p) * slot + idx
        v = tl.load(src, mask=mask, other=0, volatile=True)
        while tl.sum((v == _EMPTY).to(tl.int32), 0) > 0:
            v = tl.load(src, mask=mask, other=0, volatile=True)
        acc += v.to(dt, bitcast=True).to(tl.float32)
        tl.store(src, tl.full([BLOCK], _EMPTY, tl.int16), mask=mask)
    return acc


@triton.jit
def _arrived_all(mine, first, slot, idx, mask, WORLD: tl.constexpr, BLOCK: tl.constexpr,
                 dt: tl.constexpr):
    """``_arrived_serial``'s sum with every slot in one ``[WORLD, BLOCK]`` tile: each spin
    reloads all of them, so once the last peer's part lands one round trip ends the wait."""
    peers = tl.arange(0, WORLD)
    src = mine + (first + peers[:, None]).to(tl.int64) * slot + idx[None, :]
    m = mask[None, :] & (peers[:, None] < WORLD)
    v = tl.load(src, mask=m, other=0, volatile=True)
    while tl.sum(tl.sum((v == _EMPTY).to(tl.int32), 1), 0) > 0:
        v = tl.load(src, mask=m, other=0, volatile=True)
    tl.store(src, tl.full([WORLD, BLOCK], _EMPTY, tl.int16), mask=m)
    # one compiled layout on every rank: the same order of additions, identical sums
    return tl.sum(v.to(dt, bitcast=True).to(tl.float32), 0)


@triton.jit
def _lamport_kernel(X, Res, W, Out, ResOut, peer_ptrs, counters, n, slot, eps,
                    RANK: tl.constexpr, WORLD: tl.constexpr, CHUNK: tl.constexpr,
                    BLOCK: tl.constexpr, NORM: tl.constexpr, GRID_SIZE: tl.constexpr,
                    ONE_SPIN: tl.constexpr, ALIGNED: tl.constexpr, PDL: tl.constexpr):
    # PDL: every load and store below (the counters, the pushes, the spins) after the wait,
    # so the phase argument above holds as in stream order (pdl.py)
    pdl.enter(PDL)
    pid = tl.program_id(0)
    count = tl.load(counters + pid)
    phase = count % 2
    # NOTE: tl.cast, not .to(): under the interpreter (the CPU tests) the argument is an int
    ptrs = tl.cast(peer_ptrs, tl.pointer_type(tl.uint64))
    mine = tl.load(ptrs + RANK).to(tl.pointer_type(tl.int16))
    peers = tl.load(ptrs + tl.arange(0, WORLD)).to(tl.pointer_type(tl.int16))
    if ALIGNED:
        # NOTE: the buffers are allocation-aligned (16 bytes and more): said to the compiler,
        # so the pushes and the spins move 16-byte vectors, not 2-byte elements (8x fewer
        # NVLink writes and load instructions; the addresses come from memory, so it cannot
        # know). A chunk's offset keeps what the compiler can see (CHUNK is a constant).
        mine = tl.multiple_of(mine, 16)
        peers = tl.multiple_of(peers, 16)
    offs = tl.arange(0, BLOCK)
    n_chunks = tl.cdiv(n, CHUNK)
    dt: tl.constexpr = X.dtype.element_ty
    for c in range(pid, n_chunks, GRID_SIZE):
        idx = tl.cast(c, tl.int64) * CHUNK + offs
        mask = (offs < CHUNK) & (idx < n)
        bits = tl.load(X + idx, mask=mask, other=0.0).to(tl.int16, bitcast=True)
        bits = tl.where(bits == _EMPTY, tl.zeros_like(bits), bits)
        r = bits  # NORM: the epilogue's inputs, loaded now so they are in flight during the spin
        w = bits
        if NORM:
            r = tl.load(Res + idx, mask=mask, other=0.0)
            w = tl.load(W + offs, mask=offs < CHUNK, other=0.0)
        # push: my part into slot RANK of every buffer, as one [WORLD, BLOCK] store (the
        # peers' addresses loaded together, not one dependent round trip per peer)
        dst = peers[:, None] + ((phase * WORLD + RANK) * slot + idx)[None, :]
        tl.store(dst, tl.broadcast_to(bits[None, :], (WORLD, BLOCK)), mask=mask[None, :])
        if ONE_SPIN:
            acc = _arrived_all(mine, phase * WORLD, slot, idx, mask, WORLD, BLOCK, dt)
        else:
            acc = _arrived_serial(mine, phase * WORLD, slot, idx, mask, WORLD, BLOCK, dt)
        s = acc.to(dt)
        if NORM:  # rounded like all_reduce + fused_add_rmsnorm (kernels/rmsnorm.py)
            s = (s.to(tl.float32) + r.to(tl.float32)).to(dt)
            tl.store(ResOut + idx, s, mask=mask)
            sf = s.to(tl.float32)
            var = tl.sum(sf * sf, 0) / CHUNK
            normed = (sf * (1.0 / tl.sqrt(var + eps))).to(dt)
            tl.store(Out + idx, (w.to(tl.float32) * normed.to(tl.float32))
                     .to(Out.dtype.element_ty), mask=mask)
        else:
            tl.store(Out + idx, s, mask=mask)
    tl.store(counters + pid, count + 1)


def lamport_all_reduce(x: torch.Tensor, out: torch.Tensor, peer_ptrs_dev: int,
                       counters: torch.Tensor, slot: int, rank: int, world: int,
                       residual: torch.Tensor | None = None, weight: torch.Tensor | None = None,
                       res_out: torch.Tensor | None = None, eps: float = 0.0) -> None:
    """``out = sum over ranks of x``; with ``residual``/``weight``: ``res_out = sum + residual``
    and ``out = rmsnorm(res_out) * weight`` (rows of ``x [rows, hidden]``). ``slot``: elements per
    rank slot of the peers' buffers (``x.numel() <= slot``); ``counters``: int32 [GRID]."""
    n = x.numel()
    assert n <= slot and x.is_contiguous() and out.is_contiguous() and x.element_size() == 2
    norm = weight is not None
    if norm:
        assert residual is not None and res_out is not None and x.dim() == 2
        chunk = x.shape[1]
        block = triton.next_power_of_2(chunk)
        warps = min(max(block // 256, 1), 16)
    else:
        chunk = block = PLAIN_CHUNK
        warps = 4
    _lamport_kernel[(GRID,)](
        x, residual if norm else x, weight if norm else x, out, res_out if norm else out,
        peer_ptrs_dev, counters, n, slot, eps, RANK=rank, WORLD=world, CHUNK=chunk,
        BLOCK=block, NORM=norm, GRID_SIZE=GRID, ONE_SPIN=one_spin(),
        ALIGNED=os.environ.get("SGDSL_LAMPORT_VEC", "1") not in ("0", "false"), num_warps=warps,
        **pdl.launch(pdl.all_reduce_enabled(x)))
