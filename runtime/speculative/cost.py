"""CostGate: per batch, speculation runs only while the tokens the running requests are expected
to accept pay for what a speculative step costs against a plain one at the same batch size.

Two separate quantities decide, because they change at different speeds and belong to
different things:

- **cost ratio** ``c`` (a fact about the device, the drafter and the batch size): the seconds of
  a steady speculative step over those of a steady plain step, per range of batch sizes (1,
  2-3, 4-7, ...). A step's cost hardly depends on how many drafts were accepted, so ``c`` is
  measured on whatever steps run, by any request, and holds for the next request too;
- **expected tokens** per request of the next step (a fact about the requests running now):
  ``1 + accepted`` of each request's recent verifies (``stats.Backoff``), 1 for a request that
  does not draft. The caller passes their mean.

A step speculates when ``expected >= min_speedup * c``; per request, a recent acceptance below
``min_speedup * c - 1`` starts that request's backoff (its wait, then a probe: ``accept_bar``).
So a request in a losing phase (NGRAM where the model stops copying) keeps only itself plain,
for its own waits, while the next request (a copy) speculates from its first step. The earlier
gate compared token rates (tokens per second of speculative vs plain steps): those mix the two,
so one request's low acceptance turned speculation off for the next ones for 16-1024 steps
(issue 25 row (b) on the H200: 480 of ~620 batch-1 steps plain, 1.28x where an always-on
engine reached 1.71x on a slower host).

Timing: a step's interval runs from its launch to the next launch (a speculative step is read
synchronously, so its interval holds the drafting, the verify forward and the bookkeeping; an
overlapped plain step's holds what the device and the host take per step, whichever is longer).
Only steady intervals count. Dropped: intervals with another forward in between (a prefill); the
first plain interval after a synchronous step (the pipeline refilling; where every plain step is
read at once, as with grammar rows, the second one counts); and the first
speculative interval after any other step: it reads the step in flight synchronously and the
drafter catches up on the plain stretch (STANDALONE: an extend through the draft model). The
ratio is decided when a bucket has ``_SAMPLES`` steady intervals of each kind (if plain steps do
not come by themselves, as when every request always drafts, the gate runs a few), and decided
again after every ``_REDECIDE`` further samples. Until decided, a bucket speculates (to measure).

**Hopeless**: when even full acceptance cannot pay (``1 + k < min_speedup * c``: STANDALONE's
self-draft), the bucket stays plain for the longest wait (1024 plain steps, up to 4096 when the
probe's measured loss, its dropped first interval included, would be more than ``_PROBE_SHARE``
of the plain time in between), then is measured afresh. A drafter whose ``proposal_cost`` (a
lower bound in target steps; the model drafting for itself costs ``num_steps``) leaves
``(1 + k) / (1 + cost) <= min_speedup`` starts every bucket with that wait (a probe per short
request made the self-draft 0.69x plain on the H200).

``min_speedup`` 0 turns the gate off. Only when tokens come changes; which tokens never does.
With tensor parallelism each rank times itself, and rank 0's ratio is broadcast at each
decision (taken at the same steps on every rank: which intervals count depends on step kinds
and forward counts, never the clock), so the ranks decide alike.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from ..distributed.collectives import broadcast_object

_SAMPLES = 2  # steady intervals of each kind before a bucket's first decision
_REDECIDE = 8  # further steady samples (either kind) after which the ratio is decided again
# after a hopeless verdict: plain steps before the next probe, and up to this many when the
# probe's loss would otherwise be more than _PROBE_SHARE of the plain time in between
_MAX_WAIT = 1024
_HOPELESS_MAX_WAIT = 4 * _MAX_WAIT
_PROBE_SHARE = 0.03
_KEEP = 0.75  # weight of the older intervals in the decayed sums


@dataclass
class _Rate:
    """Decayed sums of intervals: tokens per request, seconds, steps; ``n``: samples."""

    tokens: float = 0.0
    seconds: float = 0.0
    steps: float = 0.0
    n: int = 0

    def add(self, tokens: float, seconds: float) -> None:
        keep = _KEEP if self.n else 0.0
        self.tokens = keep * self.tokens + tokens
        self.seconds = keep * self.seconds + seconds
        self.steps = keep * self.steps + 1
        self.n += 1

    @property
    def value(self) -> float:
        """Tokens per second per request."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def interval(self) -> float:
        """Seconds per step."""
        return self.seconds / self.steps if self.steps > 0 else 0.0


@dataclass
class _Bucket:
    """One range of batch sizes: its samples, its decided ratio (None: not yet), samples since
    that decision, plain steps left of a hopeless wait, and the current probe's speculative
    intervals (tokens per request, seconds; the dropped first one included)."""

    spec: _Rate = field(default_factory=_Rate)
    plain: _Rate = field(default_factory=_Rate)
    ratio: float | None = None
    fresh: int = 0
    blocked: int = 0
    probe: list[float] = field(default_factory=lambda: [0.0, 0.0])


@dataclass
class _Step:
    """The decode step launched last: when, of which kind, its tokens and batch size, the
    scheduler's forward count at its launch (one more at the next launch: no prefill), and
    whether its interval is representative of its kind's steady cost."""

    at: float
    speculative: bool
    tokens: int
    batch: int
    forwards: int
    steady: bool
    refill: bool = False


class CostGate:
    def __init__(self, min_speedup: float,
                 clock: Callable[[], float] = time.perf_counter,
                 draft_tokens: int | None = None,
                 proposal_cost: float | None = None) -> None:
        """``draft_tokens``: the most draft tokens a request verifies per step (None: no
        ceiling); ``proposal_cost``: ``Drafter.proposal_cost``, a lower bound on a proposal's
        cost in target decode steps (None: unknown)."""
        self.min_speedup = min_speedup
        self.clock = clock
        self.k = draft_tokens
        self.buckets: dict[int, _Bucket] = {}
        self.last: _Step | None = None
        self.off_steps = 0  # plain steps the gate chose (metrics: spec_cost_off_steps)
        self.losses = 0  # plain steps chosen for low expected acceptance (spec_cost_losses)
        self.dropped = 0  # first speculative intervals not counted (spec_cost_first_dropped)
        # seconds of the dropped first and of the counted speculative intervals (their means
        # in the stats: how much a switch from plain costs on this device)
        self.first_seconds = self.steady_seconds = 0.0
        self.steady = 0
        self._now = 0.0  # the current launch's start (``tick``)
        self._after_spec = False  # the step before this launch was a speculative one
        self._after_refill = False  # ... a plain one launched with nothing in flight
        self.last_rates = (0.0, 0.0)  # (speculative, plain) tokens/s of the last decision
        self.last_ratio = 0.0  # the last decision's cost ratio
        self.last_ceiling = 0.0  # the last decision's speculative rate at full acceptance
        self.hopeless = 0  # verdicts (the prior's included) that not even full acceptance pays
        self._first_block = 0  # a bucket's wait before its first probe (the prior's)
        # tokens per target step a speculative step gives at best, known before measuring:
        # 1 + k tokens for at least one target step (the verify) plus the proposal's cost
        self.prior_ceiling = (1 + draft_tokens) / (1 + proposal_cost) if (
            draft_tokens is not None and proposal_cost is not None) else None
        if self.enabled and self.prior_ceiling is not None and \
                self.prior_ceiling <= min_speedup:
            # NOTE: <=: at a tie the verify's extra rows and the synchronous read (a plain
            # step's host work overlaps the device) still lose. Not a ban: probed after the
            # longest wait, and measured as any other draft from then on
            self._first_block = _MAX_WAIT
            self.hopeless += 1

    @property
    def enabled(self) -> bool:
        return self.min_speedup > 0

    def _bucket(self, batch: int) -> _Bucket:
        key = _bucket(batch)
        got = self.buckets.get(key)
        if got is None:
            got = self.buckets[key] = _Bucket(blocked=self._first_block)
        return got

    def tick(self, forwards: int) -> None:
        """At a decode launch: close the previous step's interval (``forwards``: the
        scheduler's forward steps so far)."""
        last, self.last = self.last, None
        self._now = self.clock() if self.enabled else 0.0
        adjacent = last is not None and forwards == last.forwards + 1
        self._after_spec = adjacent and last.speculative
        self._after_refill = adjacent and last.refill
        if not self.enabled or not adjacent or last.tokens <= 0:
            return
        # NOTE: no test on the elapsed time itself: whether a sample is taken (and so when
        # the ranks of a TP group decide, below) must not depend on the clock
        elapsed = max(self._now - last.at, 1e-9)
        bucket = self._bucket(last.batch)
        if last.speculative:
            bucket.probe[0] += last.tokens / last.batch
            bucket.probe[1] += elapsed
        if not last.steady:
            if last.speculative:
                self.dropped += 1
                self.first_seconds += elapsed
            return
        if last.speculative:
            self.steady += 1
            self.steady_seconds += elapsed
        (bucket.spec if last.speculative else bucket.plain).add(last.tokens / last.batch, elapsed)
        bucket.fresh += 1
        if bucket.spec.n >= _SAMPLES and bucket.plain.n >= _SAMPLES and (
                bucket.ratio is None or bucket.fresh >= _REDECIDE):
            self._decide(bucket)

    def allow(self, batch: int, expected: float | None = None) -> bool:
        """Whether this step may speculate (False: the plain step, counted). ``expected``:
        the mean tokens per request the step is expected to give (None: unknown, as a draft
        without history: it speculates)."""
        if not self.enabled:
            return True
        bucket = self._bucket(batch)
        if bucket.blocked > 0:
            bucket.blocked -= 1
            self.off_steps += 1
            return False
        if bucket.ratio is None:  # measuring: speculative samples first, then plain ones
            if bucket.spec.n >= _SAMPLES and bucket.plain.n < _SAMPLES:
                self.off_steps += 1
                return False
            return True
        # NOTE: a hair below: a fresh start's expectation is the bar itself (1 + bar)
        if expected is not None and expected < self.min_speedup * bucket.ratio * (1 - 1e-9):
            self.off_steps += 1
            self.losses += 1
            return False
        return True

    def accept_bar(self, batch: int) -> float:
        """Accepted draft tokens per verify a request needs at this batch size for its step to
        pay (0 until the ratio is decided)."""
        if not self.enabled:
            return 0.0
        ratio = self._bucket(batch).ratio
        return self.min_speedup * ratio - 1 if ratio is not None else 0.0

    def launched(self, speculative: bool, tokens: int, batch: int, forwards: int,
                 refill: bool = False) -> None:
        """Record the decode step whose launch began at the last ``tick`` (``tokens``:
        appended by it; a plain step's: its batch size; ``refill``: a plain step launched
        with nothing in flight). A speculative step is steady only right after another."""
        if self.enabled:
            # NOTE: a refill right after another is steady: every plain step is read at once
            # there (grammar rows, overlap off), so that is what a plain step costs
            steady = self._after_spec if speculative else not refill or self._after_refill
            self.last = _Step(self._now, speculative, tokens, batch, forwards, steady, refill)

    def _decide(self, bucket: _Bucket) -> None:
        spec, plain = bucket.spec, bucket.plain
        ratio = spec.interval / plain.interval if plain.interval > 0 else 0.0
        # full acceptance (a step's cost hardly depends on how many drafts were accepted):
        # below the bar, no acceptance can pay at this batch size on this device
        hopeless = self.k is not None and 1 + self.k < self.min_speedup * ratio
        wait = self._wait(bucket.probe, plain.value) if hopeless else 0
        # every TP rank reaches this point at the same step; rank 0's clock decides for all
        ratio, hopeless, wait = broadcast_object((ratio, hopeless, wait))
        self.last_rates = (spec.value, plain.value)
        self.last_ratio = ratio
        self.last_ceiling = (1 + self.k) / spec.interval if (
            self.k is not None and spec.interval > 0) else 0.0
        bucket.ratio, bucket.fresh, bucket.probe = ratio, 0, [0.0, 0.0]
        if hopeless:
            self.hopeless += 1
            bucket.blocked = wait
            bucket.spec, bucket.ratio = _Rate(), None  # measured afresh after the wait

    @staticmethod
    def _wait(probe: list[float], plain_rate: float) -> int:
        """Plain steps after a hopeless verdict: the longest wait, or more, up to
        ``_HOPELESS_MAX_WAIT``, when the probe's loss (its intervals' time beyond what plain
        steps take for its tokens; a drafter's catch-up included) would be more than
        ``_PROBE_SHARE`` of the time between."""
        tokens, seconds = probe
        lost = max(seconds - tokens / plain_rate, 0.0) if plain_rate > 0 else 0.0
        share = int(lost * plain_rate / _PROBE_SHARE) if plain_rate > 0 else 0
        return max(_MAX_WAIT, min(share, _HOPELESS_MAX_WAIT))

    @property
    def blocked(self) -> dict[int, int]:
        """Per bucket, plain steps left of a hopeless wait."""
        return {key: b.blocked for key, b in self.buckets.items()}

    def as_dict(self) -> dict:
        spec, plain = self.last_rates
        return {"spec_cost_off_steps": self.off_steps, "spec_cost_losses": self.losses,
                "spec_cost_first_dropped": self.dropped,
                # mean intervals (s): the dropped first speculative ones vs the counted ones
                "spec_cost_first_interval": self.first_seconds / max(self.dropped, 1),
                "spec_cost_steady_interval": self.steady_seconds / max(self.steady, 1),
                # the last decision: its rates (tokens/s per request) and its cost ratio (a
                # speculative step's seconds over a plain one's: a request needs ratio - 1
                # accepted tokens per verify to pay)
                "spec_cost_spec_rate": spec, "spec_cost_plain_rate": plain,
                "spec_cost_ratio": self.last_ratio,
                # the last decision's rate at full acceptance; verdicts (and the prior's)
                # that even it could not pay; the prior's bound (tokens per target step)
                "spec_cost_ceiling_rate": self.last_ceiling,
                "spec_cost_hopeless": self.hopeless,
                "spec_cost_prior_ceiling": self.prior_ceiling or 0.0}


def _bucket(batch: int) -> int:
    """Batch sizes sharing their costs: 1, 2-3, 4-7, 8-15, ... (costs per step)."""
    return batch.bit_length()
