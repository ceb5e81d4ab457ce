"""StepTrace ($SGDSL_STEP_TRACE): one line per loop iteration that launched or handled
something, with where its host time went, and the report that summarizes the file."""
from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

from sgdsl.runtime.scheduler.step_trace import make_trace


class _PD:
    def __init__(self) -> None:
        self.counters = {"pd_kv_tokens_received": 0}

    def poll(self) -> None:
        time.sleep(0.002)
        self.counters["pd_kv_tokens_received"] += 64

    def stats(self) -> dict:
        return {**self.counters, "pd_waiting_kv_reqs": 1}


class _Sched:
    """The attributes StepTrace reads and the methods it times."""

    def __init__(self) -> None:
        self.counters = {"forward_steps": 0, "extend_steps": 0}
        self.running, self.waiting, self.pd = [1, 2], [], _PD()

    def _launch_decode(self) -> None:
        self.counters["forward_steps"] += 1

    def step(self, launch: bool) -> None:
        self.pd.poll()
        if launch:
            self._launch_decode()


def _report_module():
    path = Path(__file__).resolve().parents[3] / "benchmarks/gpu/step_trace_report.py"
    spec = importlib.util.spec_from_file_location("step_trace_report", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_off_without_the_variable(monkeypatch):
    monkeypatch.delenv("SGDSL_STEP_TRACE", raising=False)
    sched = _Sched()
    assert make_trace(sched, 0) is None
    assert "_launch_decode" not in vars(sched)  # nothing wrapped: the loop pays nothing


def test_lines_time_the_parts_and_the_report_reads_them(monkeypatch, tmp_path):
    monkeypatch.setenv("SGDSL_STEP_TRACE", str(tmp_path))
    sched = _Sched()
    trace = make_trace(sched, 3)
    for launch in (True, False, True):
        trace.begin()
        trace.handled(0)
        sched.step(launch)
        trace.end()
    trace.close()
    path = tmp_path / "steps-rank3.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 2  # the iteration that launched nothing and handled nothing is skipped
    assert all(r["launched"] == 1 and r["extend"] == 0 and r["running"] == 2 for r in rows)
    assert all(r["pd.poll"] >= 2.0 and r["ms"] >= r["pd.poll"] for r in rows)
    assert rows[1]["pd_kv_tokens_received"] == 3 * 64 and rows[1]["pd_waiting_kv_reqs"] == 1
    text = _report_module().summarize(str(path))
    assert "2 launched iterations (0 extend)" in text
    means = next(line for line in text.splitlines() if "mean ms per iteration:" in line)
    assert "pd.poll" in means  # each part's mean over the launched iterations
    assert '"pd_kv_tokens_received": 128' in text  # the change since the line before
