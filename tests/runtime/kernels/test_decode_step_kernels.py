"""tp-step: the whole decode step's two kernels (runtime/kernels/decode_step.py) equal their torch
references (model/step_ops.py): ``prepare`` writes the live rows' table entries and inputs and
nothing for padded rows; ``finish`` picks the first index of each row's maximum (ties inside a
chunk and across chunks), writes ``last_token`` by destination and the host ring for live rows
only (on a GPU the ring is page-locked host memory the kernel writes over UVA)."""
from __future__ import annotations

import torch

from sgdsl.runtime.kernels import decode_step
from sgdsl.runtime.model import step_ops
from sgdsl.runtime.model.step_ops import DEST, LENS, LOCS, POS, ROWS, SLOT

MAX_BS, ROWS_N, WIDTH = 8, 6, 40
SINK = ROWS_N  # last_token has ROWS_N + 1 entries


def _meta(device: str, live: int, n: int) -> torch.Tensor:
    meta = torch.zeros(6, MAX_BS, dtype=torch.int64)
    rows = torch.tensor([4, 1, 5, 0, 2, 3])[:live]
    meta[ROWS, :live] = rows
    meta[POS, :live] = torch.tensor([7, 3, 39, 1, 12, 20])[:live]
    meta[LENS] = meta[POS] + 1
    meta[LOCS, :live] = torch.tensor([101, 102, 103, 104, 105, 106])[:live]
    meta[DEST, :live] = rows
    meta[DEST, live:n] = SINK  # padded rows
    meta[SLOT, 0] = 2
    return meta.to(device)


def test_prepare_matches_reference(device):
    meta = _meta(device, live=3, n=4)
    last = torch.arange(50, 50 + ROWS_N + 1, device=device)
    table = torch.randint(0, 99, (ROWS_N, WIDTH), device=device)
    inputs = torch.full((MAX_BS,), -1, dtype=torch.int64, device=device)
    want_table, want_inputs = table.clone(), inputs.clone()
    step_ops.prepare_ref(meta, 4, last, want_table, want_inputs, SINK)
    decode_step.prepare(meta, 4, last, table, inputs, SINK)
    assert torch.equal(table, want_table) and torch.equal(inputs, want_inputs)
    assert want_inputs[:3].tolist() == [54, 51, 55] and want_inputs[3:].eq(-1).all()
    assert want_table[4, 7] == 101 and want_table[5, 39] == 103


def test_finish_first_maximum_ring_and_destinations(device):
    chunks, vocab, n = 64, 64 * 8, 4
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(n, vocab, generator=gen)
    logits[0, [9, 10, 300]] = 50.0  # ties inside a chunk and across chunks: the first wins
    logits[1, [200, 17]] = 60.0
    logits[2, vocab - 1] = 70.0
    logits = logits.to(device)
    meta = _meta(device, live=3, n=n)
    ring_kw = dict(pin_memory=True) if device == "cuda" else {}
    outs = []
    for run in ("kernel", "ref"):
        last = torch.zeros(ROWS_N + 1, dtype=torch.int64, device=device)
        ring = torch.full((4, MAX_BS), -1, dtype=torch.int64, **ring_kw)
        if run == "kernel":
            ids = decode_step.finish(logits, chunks, meta, last, ring, SINK)
        else:
            ids = step_ops.finish_ref(logits, meta, last, ring, SINK)
        if device == "cuda":
            torch.cuda.synchronize()
        outs.append((ids.cpu(), last.cpu(), ring.clone()))
    (ids, last, ring), (ref_ids, ref_last, ref_ring) = outs
    assert torch.equal(ids, ref_ids) and torch.equal(ids, logits.argmax(-1).cpu())
    assert ids[:3].tolist() == [9, 17, vocab - 1]
    assert torch.equal(last[:SINK], ref_last[:SINK]) and last[SINK] == ids[3]  # padded: sink
    assert torch.equal(ring, ref_ring)
    assert ring[2, :3].tolist() == ids[:3].tolist() and ring[2, 3:].eq(-1).all()
    assert ring[[0, 1, 3]].eq(-1).all()


def test_finish_pairs_takes_the_first_rank_holding_the_maximum(device):
    """tp-step's greedy pick without the logits' all-gather: each TP rank's (value, id) pair,
    the first rank with the largest value wins (ties: the lower rank, i.e. the lower id)."""
    vals = torch.tensor([[1.0, 3.0, 3.0, 2.0], [5.0, 1.0, 5.0, 5.0], [0.0, 0.0, 0.0, 9.0]],
                        device=device)
    ids = torch.tensor([[7, 300, 600, 900], [12, 301, 650, 999], [1, 2, 3, 1000]],
                       device=device)
    meta = _meta(device, live=3, n=3)
    last = torch.zeros(ROWS_N + 1, dtype=torch.int64, device=device)
    ring = torch.full((4, MAX_BS), -1, dtype=torch.int64,
                      **(dict(pin_memory=True) if device == "cuda" else {}))
    got = decode_step.finish_pairs(vals, ids, 0, meta, last, ring, SINK)
    if device == "cuda":
        torch.cuda.synchronize()
    assert got.tolist() == [300, 12, 1000] and ring[2, :3].tolist() == [300, 12, 1000]
    assert last[[4, 1, 5]].tolist() == [300, 12, 1000]
