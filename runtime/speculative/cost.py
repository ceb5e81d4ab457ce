"""CostGate: per batch, speculation stays on only while it produces tokens faster than plain
decoding at the same batch size.

Acceptance alone cannot tell: a draft as large as the target (STANDALONE self-draft) is always
accepted and still loses, since its draft forwards cost as much as the target's steps. So the
gate times both kinds of decode step on the scheduler's own clock: a step's interval runs from
its launch to the next launch (a speculative step is read synchronously, so its interval holds
the drafting, the verify forward and the bookkeeping; an overlapped plain step's holds what the
device and the host take per step, whichever is longer), and its tokens are the output tokens
it appended. Intervals with another forward in between (a prefill) are dropped, and so is the
first plain interval after a synchronous step (the pipeline refilling: its launch had nothing in
flight to read). Rates are tokens per second per request, kept as moving averages per range of
batch sizes (1, 2-3, 4-7, ...: a batch that shrinks as requests finish keeps its history).

Once a batch size has a few speculative samples it needs plain ones too (if plain steps did
not come by themselves, as when every request always drafts, the gate runs a few); when the
speculative rate falls below ``min_speedup`` times the plain rate (over two samples, or one that
falls far below) speculation is off for ``wait`` steps (16, doubling on each loss up to
``_MAX_WAIT``; halving on each win), then probed again with fresh samples. ``min_speedup`` 0
turns the gate off. Only when tokens come changes; which tokens (greedy or sampled: the same
distribution) never does. With tensor parallelism each rank times itself, and rank 0's verdict
is broadcast at each comparison (samples are taken at the same steps on every rank), so the
ranks keep deciding alike.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from ..distributed.collectives import broadcast_object

# plain steps between probes after a loss: a probe that clearly loses again costs one
# speculative step, so a draft that always loses costs about log2(steps / 16) of them in all
_MIN_WAIT, _MAX_WAIT = 16, 1024
_SPEC_SAMPLES = 2  # speculative intervals measured before a close comparison (after each wait)
_CLEAR_LOSS = 0.8  # below this share of the needed rate one interval decides
_PLAIN_SAMPLES = 2
_ALPHA = 0.25  # weight of the newest interval in the moving averages


@dataclass
class _Rate:
    """Moving average of tokens per second; ``n``: samples since the last reset."""

    value: float = 0.0
    n: int = 0

    def add(self, rate: float) -> None:
        self.value = rate if self.n == 0 else (1 - _ALPHA) * self.value + _ALPHA * rate
        self.n += 1


@dataclass
class _Step:
    """The decode step launched last: when, of which kind, its tokens and batch size, and
    the scheduler's forward count at its launch (one more at the next launch: no prefill)."""

    at: float
    speculative: bool
    tokens: int
    batch: int
    forwards: int
    refill: bool  # a plain step launched with nothing in flight (interval not representative)


class CostGate:
    def __init__(self, min_speedup: float,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.min_speedup = min_speedup
        self.clock = clock
        self.spec: dict[int, _Rate] = {}
        self.plain: dict[int, _Rate] = {}
        self.wait = 0
        self.penalty = _MIN_WAIT
        self.last: _Step | None = None
        self.off_steps = 0  # plain steps the gate chose (metrics: spec_cost_off_steps)
        self.losses = 0  # comparisons speculation lost (spec_cost_losses)
        self._now = 0.0  # the current launch's start (``tick``)
        self.last_rates = (0.0, 0.0)  # (speculative, plain) of the last comparison

    @property
    def enabled(self) -> bool:
        return self.min_speedup > 0

    def tick(self, forwards: int) -> None:
        """At a decode launch: close the previous step's interval (``forwards``: the
        scheduler's forward steps so far)."""
        last, self.last = self.last, None
        self._now = self.clock() if self.enabled else 0.0
        if not self.enabled or last is None or forwards != last.forwards + 1 or last.refill:
            return
        # NOTE: no test on the elapsed time itself: whether a sample is taken (and so when
        # the ranks of a TP group compare, below) must not depend on the clock
        elapsed = max(self._now - last.at, 1e-9)
        if last.tokens <= 0:
            return
        rates = self.spec if last.speculative else self.plain
        bucket = _bucket(last.batch)
        rates.setdefault(bucket, _Rate()).add(last.tokens / (elapsed * last.batch))
        if last.speculative:
            self._judge(bucket)

    def allow(self, batch: int) -> bool:
        """Whether this step may speculate (False: the plain step, counted)."""
        if not self.enabled:
            return True
        spec, plain = self.spec.get(_bucket(batch)), self.plain.get(_bucket(batch))
        exploring = spec is not None and spec.n >= _SPEC_SAMPLES and (
            plain is None or plain.n < _PLAIN_SAMPLES)
        if self.wait > 0 or exploring:
            self.wait = max(self.wait - 1, 0)
            self.off_steps += 1
            return False
        return True

    def launched(self, speculative: bool, tokens: int, batch: int, forwards: int,
                 refill: bool = False) -> None:
        """Record the decode step whose launch began at the last ``tick`` (``tokens``:
        appended by it; a plain step's: its batch size)."""
        if self.enabled:
            self.last = _Step(self._now, speculative, tokens, batch, forwards, refill)

    def _judge(self, bucket: int) -> None:
        spec, plain = self.spec[bucket], self.plain.get(bucket)
        if plain is None or plain.n < _PLAIN_SAMPLES:
            return
        need = self.min_speedup * plain.value
        self.last_rates = (spec.value, plain.value)
        # NOTE: one sample decides a clear loss (a probe of a draft that always loses then
        # costs one speculative step, not two); a close call waits for a second
        loss = spec.value < _CLEAR_LOSS * need or (spec.n >= _SPEC_SAMPLES and spec.value < need)
        # every TP rank reaches this point at the same step; rank 0's clock decides for all
        loss = broadcast_object(loss)
        if loss:
            self.losses += 1
            self.wait = self.penalty
            self.penalty = min(2 * self.penalty, _MAX_WAIT)
            spec.n = 0  # measured afresh after the wait
        elif spec.n >= _SPEC_SAMPLES:
            self.penalty = max(self.penalty // 2, _MIN_WAIT)

    def as_dict(self) -> dict:
        spec, plain = self.last_rates
        return {"spec_cost_off_steps": self.off_steps, "spec_cost_losses": self.losses,
                # the last comparison's rates (tokens/s per request): what the gate saw
                "spec_cost_spec_rate": spec, "spec_cost_plain_rate": plain}


def _bucket(batch: int) -> int:
    """Batch sizes sharing their rates: 1, 2-3, 4-7, 8-15, ... (rates per request)."""
    return batch.bit_length()
