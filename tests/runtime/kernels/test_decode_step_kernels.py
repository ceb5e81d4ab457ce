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


def test_local_max_first_maximum_of_a_column_slice(device):
    """tp-step: each row's first maximum over a rank's real columns (a row-strided slice,
    ties inside a block and across blocks), as (value, offset + column) in fp32."""
    gen = torch.Generator().manual_seed(1)
    full = torch.randn(3, 9100, generator=gen)
    full[0, [10, 5000]] = 9.0  # across blocks: the first
    full[1, [4200, 4201]] = 9.0  # inside a block: the first
    full[2, 9050] = 99.0  # past the slice: ignored
    local = full.to(device)[:, :9000]
    pair = decode_step.local_max(local, 64128).cpu()
    vals, idx = local.cpu().max(dim=-1)
    assert torch.equal(pair[:, 0], vals) and pair[:, 1].tolist() == (idx + 64128).tolist()
    assert pair[:2, 1].tolist() == [64138.0, 68328.0]


def test_finish_gathered_takes_the_first_rank_holding_the_maximum(device):
    """tp-step: from every rank's (value, id) pairs ``[tp, n, 2]``, the first rank with the
    largest value gives the id (ties: the lower rank, i.e. the lower id); writes as finish."""
    vals = torch.tensor([[1.0, 3.0, 3.0, 2.0], [5.0, 1.0, 5.0, 5.0], [0.0, 0.0, 0.0, 9.0]])
    ids = torch.tensor([[7, 300, 600, 900], [12, 301, 650, 999], [1, 2, 3, 1000]])
    gathered = torch.stack([vals.t(), ids.t().float()], dim=-1).contiguous().to(device)
    meta = _meta(device, live=3, n=3)
    last = torch.zeros(ROWS_N + 1, dtype=torch.int64, device=device)
    ring = torch.full((4, MAX_BS), -1, dtype=torch.int64,
                      **(dict(pin_memory=True) if device == "cuda" else {}))
    got = decode_step.finish_gathered(gathered, meta, last, ring, SINK)
    if device == "cuda":
        torch.cuda.synchronize()
    assert got.tolist() == [300, 12, 1000] and ring[2, :3].tolist() == [300, 12, 1000]
    assert last[[4, 1, 5]].tolist() == [300, 12, 1000]
