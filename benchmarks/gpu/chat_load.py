"""LoadPoint: when each simulated chat user sends each turn (bench_hicache.py's load shapes).

- **closed** (``rate == 0``, no think time): every conversation starts at once and sends its
  next turn as soon as the answer is in. The engine is saturated: TTFT is mostly the wait
  behind every other conversation, so it measures throughput again.
- **users** (``rate == 0`` with a think time ``Z``): a fixed population of users, each reading
  an answer and typing for about ``Z`` seconds before the next turn (the classic interactive
  load); first turns are spread over one think time. The offered load is about
  conversations / ``Z`` turns per second and every conversation stays live all run.
- **open** (``rate > 0`` conversations per second): conversations arrive as a Poisson process
  and think between turns as above. An engine that cannot keep up builds a queue and its TTFT
  grows with the run, as a real service's would.

Think times are uniform in [Z/2, 3Z/2] (not exponential): many users' turns together still
arrive about as a Poisson stream, and the run's length stays bounded (the slowest of 128
exponential users would take ~7 think times per gap). Every draw is seeded by the
conversation's index, so each engine sees the same schedule. ``Occupancy`` measures what the
cache actually had to hold: the time-averaged context of the conversations in progress (the
*live* working set), next to the device pool.
"""
from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class LoadPoint:
    rate: float  # conversations arriving per second; 0: all there from the start
    think_time: float  # mean seconds between an answer and the next turn (0: none)

    @property
    def name(self) -> str:
        if self.rate > 0:
            return f"{self.rate:g}/s"
        return f"think {self.think_time:g}s" if self.think_time > 0 else "closed"

    def start(self, conv: int) -> float:
        """Seconds after the run's start at which conversation ``conv`` sends its first turn."""
        if self.rate > 0:
            gaps = random.Random(7)  # one arrival stream: conversation c is the (c+1)-th
            return sum(gaps.expovariate(self.rate) for _ in range(conv + 1))
        return random.Random(1000 + conv).uniform(0, self.think_time)

    def pauses(self, conv: int, turns: int) -> list[float]:
        """Seconds a user waits before each turn: the start for turn 0, think times after."""
        rng = random.Random(2000 + conv)
        z = self.think_time
        return [self.start(conv), *(rng.uniform(z / 2, 3 * z / 2) for _ in range(turns - 1))]

    def offered_turns_per_s(self, turns: int, conversations: int) -> float:
        """Turns per second the load asks for in steady state (0: as fast as served)."""
        if self.rate > 0:
            return self.rate * turns
        return conversations / self.think_time if self.think_time > 0 else 0.0


def parse_points(text: str, think_time: float) -> list[LoadPoint]:
    """``closed,think:16,1.5`` -> the closed loop (with ``think_time``, the users load), 16 s
    users, and conversations arriving at 1.5/s thinking ``think_time``."""
    points = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        if item == "closed":
            points.append(LoadPoint(0.0, think_time))
        elif item.startswith("think:"):
            points.append(LoadPoint(0.0, _nonneg(item[6:], item)))
        else:
            points.append(LoadPoint(_nonneg(item, item), think_time))
    if not points:
        raise ValueError("no load point given")
    return points


def _nonneg(text: str, item: str) -> float:
    value = float(text)
    if not value >= 0:
        raise ValueError(f"load point {item!r}: must be >= 0")
    return value


class Occupancy:
    """Each conversation's [first send, last answer] and its final context (tokens)."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float, int]] = []

    def add(self, begin: float, end: float, tokens: int) -> None:
        self.spans.append((begin, end, tokens))

    def mean_live_tokens(self, wall: float) -> float:
        """Context tokens of the conversations in progress, averaged over ``wall`` seconds."""
        if wall <= 0:
            return 0.0
        return sum((end - begin) * tokens for begin, end, tokens in self.spans) / wall

    def peak_live(self) -> int:
        """Most conversations in progress at once."""
        events = sorted([(b, 1) for b, _, _ in self.spans] + [(e, -1) for _, e, _ in self.spans])
        live = peak = 0
        for _, step in events:
            live += step
            peak = max(peak, live)
        return peak
