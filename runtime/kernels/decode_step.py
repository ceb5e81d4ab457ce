"""The two small kernels of a whole decode step (model/step_graphs.py, model/step_ops.py), each
one launch inside the step's CUDA graph where torch needed several launches outside it.

``prepare`` (before the forward): for each live row ``i`` (``dest[i] != sink``) write its new KV
slot into the request->slot table (``table[rows[i], pos[i]] = locs[i]``) and gather its input
token (``input_ids[i] = last_token[rows[i]]``); padded rows and the rows of an explicit batch
(every ``dest`` the sink) touch nothing.

``finish`` (after the logits): the second half of the greedy argmax (``layers/sampler.py``
``two_step_argmax``: the chunk holding the row's maximum, the first of equal ones, then that
chunk's index), the id written to ``ids``, to ``last_token[dest[i]]`` (the next step's input)
and, for a live row, to row ``i`` of a page-locked host ring's slot ``meta[SLOT, 0]``: the
scheduler reads the ids there after an event, with no device-to-host copy queued between two
graphs. Under TP an all-greedy step may skip the logits' all-gather (model/step_ops.py
``pick_local``): ``local_max`` gives each row's (value, id) over this rank's columns, the
ranks all-gather those pairs, and ``finish_gathered`` picks the first rank with the largest
value and writes as ``finish`` does. The host
ring is a kernel argument, so Triton's launcher asks the driver for its device address (a
page-locked mapped buffer has one, over UVA; ``hicache``'s ``kv_move.py`` does the same).

Both read ``meta``, the step's indices ``[6, max_bs]`` int64 (rows: request rows, positions,
lengths, KV slots, id destinations, the ring slot at ``[5, 0]``; step_graphs.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

ROWS, POS, LENS, LOCS, DEST, SLOT = range(6)
BLOCK = 128
LOCAL_BLOCK = 4096  # columns a local-max program reads per iteration


@triton.jit
def _prepare_kernel(Meta, LastToken, Table, InputIds, n, max_bs, width, sink,
                    BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    rows = tl.load(Meta + 0 * max_bs + i, mask=m, other=0)
    pos = tl.load(Meta + 1 * max_bs + i, mask=m, other=0)
    locs = tl.load(Meta + 3 * max_bs + i, mask=m, other=0)
    dest = tl.load(Meta + 4 * max_bs + i, mask=m, other=sink)
    live = m & (dest != sink)
    tl.store(Table + rows * width + pos, locs, mask=live)
    tl.store(InputIds + i, tl.load(LastToken + rows, mask=live, other=0), mask=live)


@triton.jit
def _write_id(tok, row, Meta, LastToken, Ids, Ring, max_bs, sink, RING: tl.constexpr):
    tl.store(Ids + row, tok)
    dest = tl.load(Meta + 4 * max_bs + row)
    tl.store(LastToken + dest, tok)
    if RING:  # live rows only: an explicit batch must not touch a slot the host still reads
        tl.store(Ring + tl.load(Meta + 5 * max_bs) * max_bs + row, tok, mask=dest != sink)


@triton.jit
def _finish_kernel(Vals, Idx, Meta, LastToken, Ids, Ring, max_bs, chunk, sink,
                   C: tl.constexpr, RING: tl.constexpr):
    row = tl.program_id(0)
    c = tl.arange(0, C)
    vals = tl.load(Vals + row * C + c)
    best = tl.argmax(vals, axis=0, tie_break_left=True)
    tok = best.to(tl.int64) * chunk + tl.load(Idx + row * C + best)
    _write_id(tok, row, Meta, LastToken, Ids, Ring, max_bs, sink, RING)


@triton.jit
def _local_max_kernel(Logits, stride, width, offset, Pair, BLOCK: tl.constexpr):
    # one row's first maximum over this rank's columns -> (value, offset + column) as fp32
    row = tl.program_id(0)
    best_v = tl.zeros((), tl.float32) - float("inf")
    best_i = tl.zeros((), tl.int32)
    for start in range(0, width, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        v = tl.load(Logits + row * stride + cols, mask=cols < width, other=float("-inf"))
        m = tl.max(v, axis=0)
        i = tl.argmax(v, axis=0, tie_break_left=True)
        take = m > best_v  # strictly: an earlier block keeps a tie
        best_i = tl.where(take, start + i, best_i)
        best_v = tl.where(take, m, best_v)
    tl.store(Pair + row * 2, best_v)
    tl.store(Pair + row * 2 + 1, (best_i + offset).to(tl.float32))


@triton.jit
def _finish_gathered_kernel(Gathered, n, Meta, LastToken, Ids, Ring, max_bs, sink,
                            TP: tl.constexpr, RING: tl.constexpr):
    # Gathered [TP, n, 2]: every rank's pairs; the first rank with the largest value wins
    row = tl.program_id(0)
    r = tl.arange(0, TP)
    vals = tl.load(Gathered + r * n * 2 + row * 2)
    best = tl.argmax(vals, axis=0, tie_break_left=True)
    tok = tl.load(Gathered + best * n * 2 + row * 2 + 1).to(tl.int64)
    _write_id(tok, row, Meta, LastToken, Ids, Ring, max_bs, sink, RING)


def prepare(meta: torch.Tensor, n: int, last_token: torch.Tensor, table: torch.Tensor,
            input_ids: torch.Tensor, sink: int) -> None:
    """See the module docstring; rows ``0 .. n-1``."""
    assert meta.is_contiguous() and table.is_contiguous() and input_ids.is_contiguous()
    _prepare_kernel[(triton.cdiv(n, BLOCK),)](meta, last_token, table, input_ids, n,
                                              meta.shape[1], table.shape[1], sink,
                                              BLOCK=BLOCK, num_warps=1)


def finish(logits: torch.Tensor, chunks: int, meta: torch.Tensor, last_token: torch.Tensor,
           ring: torch.Tensor | None, sink: int) -> torch.Tensor:
    """The rows' greedy ids ``[n]`` (see the module docstring); ``chunks`` divides the vocab."""
    n, vocab = logits.shape
    vals, idx = logits.reshape(n, chunks, vocab // chunks).max(dim=-1)
    return finish_pairs(vals, idx, vocab // chunks, meta, last_token, ring, sink)


def finish_pairs(vals: torch.Tensor, idx: torch.Tensor, chunk: int, meta: torch.Tensor,
                 last_token: torch.Tensor, ring: torch.Tensor | None, sink: int
                 ) -> torch.Tensor:
    """``finish`` from each row's candidates ``vals``/``idx [n, C]`` (C a power of 2): the
    first largest value's ``best * chunk + idx``."""
    n, c = vals.shape
    ids = torch.empty(n, dtype=torch.int64, device=vals.device)
    _finish_kernel[(n,)](vals.contiguous(), idx.contiguous(), meta, last_token, ids,
                         ids if ring is None else ring, meta.shape[1], chunk, sink,
                         C=c, RING=ring is not None, num_warps=1)
    return ids


def local_max(local: torch.Tensor, offset: int) -> torch.Tensor:
    """tp-step: each row's first maximum over this rank's logit columns ``local [n, w]`` (a
    row-strided view) as ``[n, 2]`` fp32 (value, ``offset`` + column): what the ranks
    all-gather instead of the logits (model/step_ops.py ``pick_local``)."""
    n, width = local.shape
    assert local.stride(1) == 1
    pair = torch.empty(n, 2, dtype=torch.float32, device=local.device)
    _local_max_kernel[(n,)](local, local.stride(0), width, offset, pair, BLOCK=LOCAL_BLOCK,
                            num_warps=8)
    return pair


def finish_gathered(gathered: torch.Tensor, meta: torch.Tensor, last_token: torch.Tensor,
                    ring: torch.Tensor | None, sink: int) -> torch.Tensor:
    """``finish`` from every rank's pairs ``gathered [tp, n, 2]`` (tp a power of 2): the first
    rank with the row's largest value gives its id."""
    tp, n, _ = gathered.shape
    assert gathered.is_contiguous()
    ids = torch.empty(n, dtype=torch.int64, device=gathered.device)
    _finish_gathered_kernel[(n,)](gathered, n, meta, last_token, ids,
                                  ids if ring is None else ring, meta.shape[1], sink,
                                  TP=tp, RING=ring is not None, num_warps=1)
    return ids
