"""bench_hicache's load shapes (benchmarks/gpu/chat_load.py): the same schedule for every
engine, think times bounded, the offered rate and the live working set as documented."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks" / "gpu"))
from chat_load import LoadPoint, Occupancy, parse_points  # noqa: E402


def test_parse_points_names_and_shapes():
    points = parse_points("closed, think:16,1.5", think_time=4.0)
    assert points == [LoadPoint(0.0, 4.0), LoadPoint(0.0, 16.0), LoadPoint(1.5, 4.0)]
    assert [p.name for p in points] == ["think 4s", "think 16s", "1.5/s"]
    assert parse_points("closed", 0.0)[0].name == "closed"
    for bad in ("", "think:-1", "-2"):
        with pytest.raises(ValueError):
            parse_points(bad, 0.0)


def test_closed_loop_sends_everything_at_once():
    point = LoadPoint(0.0, 0.0)
    assert all(point.pauses(c, 4) == [0.0] * 4 for c in range(8))
    assert point.offered_turns_per_s(4, 8) == 0.0


def test_users_think_within_bounds_and_are_reproducible():
    point = LoadPoint(0.0, 10.0)
    waits = [point.pauses(c, 5) for c in range(64)]
    assert waits == [point.pauses(c, 5) for c in range(64)]  # the same for every engine
    assert all(0 <= w[0] <= 10 for w in waits)  # first turns spread over one think time
    assert all(5 <= x <= 15 for w in waits for x in w[1:])
    assert len({w[1] for w in waits}) == 64  # users differ
    assert point.offered_turns_per_s(5, 64) == pytest.approx(6.4)


def test_open_arrivals_are_an_increasing_poisson_stream():
    point = LoadPoint(2.0, 3.0)
    starts = [point.start(c) for c in range(400)]
    assert starts == sorted(starts) and starts[0] > 0
    assert starts[-1] / 400 == pytest.approx(0.5, rel=0.2)  # mean gap 1 / rate
    assert point.offered_turns_per_s(8, 400) == 16.0


def test_occupancy_time_averages_live_context():
    occ = Occupancy()
    occ.add(0.0, 10.0, 1000)  # live the whole 10 s
    occ.add(5.0, 10.0, 2000)  # live half of it
    occ.add(10.0, 12.0, 500)  # starts as the others end: never three at once
    assert occ.mean_live_tokens(10.0) == pytest.approx((10 * 1000 + 5 * 2000 + 2 * 500) / 10)
    assert occ.peak_live() == 2
    assert occ.mean_live_tokens(0.0) == 0.0
