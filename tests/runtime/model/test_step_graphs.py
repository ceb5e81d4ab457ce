"""tp-step: a whole decode step of the step graphs (model/step_graphs.py) run eagerly on the CPU,
padded as a replay pads: the live rows' logits equal a plain decode forward's, the greedy ids
land in ``last_token`` at the live rows only (padded rows write the sink), the device table gets
the new slots, the ids reach the host ring, and an explicit batch (a replay's path) writes no
ids, no table entry and no ring slot. The kernels of the GPU path: test_decode_step_kernels.py."""
from __future__ import annotations

import pytest
import torch

from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.model.forward_batch import ForwardMode
from sgdsl.runtime.model.runner import ModelRunner
from sgdsl.runtime.model.step_graphs import StepGraphs

from .driver import RunnerDriver

PROMPTS = [[5, 17, 200, 3, 99], [11, 12], [249, 1, 2, 3, 4, 5, 6, 7]]


@pytest.fixture(scope="module")
def runner(tiny_model_dir):
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SGDSL_DECODE_STEP", "eager")
        return ModelRunner(EngineConfig(model=str(tiny_model_dir), load_format="dummy",
                                        max_total_tokens=512, max_running_requests=8,
                                        num_threads=1))


def _prefilled(runner) -> tuple[RunnerDriver, list, torch.Tensor]:
    d = RunnerDriver(runner)
    reqs = [d.new_request() for _ in PROMPTS]
    first = d.extend(list(zip(reqs, PROMPTS))).argmax(-1)
    runner.last_token[torch.tensor([r.row for r in reqs])] = first
    return d, reqs, first


def test_padded_step_equals_plain_decode_and_writes_live_rows_only(runner):
    graphs = runner.step_graphs
    assert isinstance(graphs, StepGraphs) and runner.cuda_graph_runner is None
    d, reqs, first = _prefilled(runner)
    rows = torch.tensor([r.row for r in reqs])
    table = runner.req_to_token_pool.req_to_token
    before = runner.last_token.clone()
    plain = d.decode(list(zip(reqs, first.tolist())))  # the reference, into the same columns
    pos = torch.tensor([len(r.tokens) - 1 for r in reqs])
    slots = table[rows, pos].clone()
    table[rows, pos] = 0  # the step must write them back
    graphs.pad_eager = True  # 3 rows run as the graph of 4 would
    try:
        logits, ids, host = graphs.step(rows, pos, slots, None)
    finally:
        graphs.pad_eager = False
    assert logits.shape[0] == 3 and graphs.padded_size(3) == 4
    assert float((logits - plain).abs().max()) < 1e-5
    assert torch.equal(ids, plain.argmax(-1)) and host.tolist() == ids.tolist()
    assert torch.equal(table[rows, pos], slots)
    want = before.clone()
    want[rows] = ids
    assert torch.equal(runner.last_token[:-1], want[:-1])  # the padded row wrote the sink


def test_explicit_batch_after_a_step_writes_no_ids(runner):
    graphs = runner.step_graphs
    d, reqs, first = _prefilled(runner)
    rows = torch.tensor([r.row for r in reqs])
    pos = torch.tensor([len(r.tokens) for r in reqs])
    slots = runner.token_kv_pool.alloc(len(reqs))
    table = runner.req_to_token_pool.req_to_token
    _, ids, host = graphs.step(rows, pos, slots, None)
    held = host.tolist()
    for r, t in zip(reqs, first.tolist()):
        r.tokens.append(t)
    before, ring = runner.last_token.clone(), graphs.ring.clone()
    nxt = runner.last_token[rows].tolist()
    pairs = [(r, [t]) for r, t in zip(reqs, nxt)]
    prefix = [len(r.tokens) for r in reqs]
    slots2 = runner.token_kv_pool.alloc(len(reqs))
    table[rows, torch.tensor(prefix)] = slots2
    batch = d._batch(ForwardMode.DECODE, pairs, nxt, prefix, slots2, prefix, [1] * 3, None)
    padded = graphs.load(batch)  # what ``replay`` runs, eagerly
    table_before = table.clone()
    logits, _ = graphs._run(graphs.static_batch(padded))
    # no ids, no table entries, no ring slot (the host may still read the last step's)
    assert torch.equal(runner.last_token, before) and torch.equal(graphs.ring, ring)
    assert torch.equal(table, table_before) and host.tolist() == held == ids.tolist()
    assert float((logits[:3] - runner.forward_eager(batch)).abs().max()) < 1e-5


def test_step_timeline_medians(tmp_path):
    """tp-step: $SGDSL_STEP_TIMELINE's summary: the graph's own time, the period between two
    starts and the time between two graphs (fake events 1 ms apart, graphs 0.75 ms long)."""
    import json

    from sgdsl.runtime.model.step_timeline import StepTimeline

    class Mark:
        def __init__(self, ms: float) -> None:
            self.ms = ms

        def elapsed_time(self, other: "Mark") -> float:
            return other.ms - self.ms

        def synchronize(self) -> None:
            pass

    line = StepTimeline(str(tmp_path / "tl"), rank=1, skip=0, count=4)
    line.events = [(Mark(t), Mark(t + 0.75), 1) for t in (0.0, 1.0, 2.0, 3.0)]
    line._write()
    out = json.loads((tmp_path / "tl-rank1.json").read_text())
    assert out["steps"] == 4 and out["rows"] == [1]
    assert out["graph_us"] == 750 and out["period_us"] == 1000 and out["between_us"] == 250
