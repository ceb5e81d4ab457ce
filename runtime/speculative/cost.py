"""CostGate: per batch, speculation stays on only while it produces tokens faster than plain
decoding at the same batch size.

Acceptance alone cannot tell: a draft as large as the target (STANDALONE self-draft) is always
accepted and still loses, since its draft forwards cost as much as the target's steps. So the
gate times both kinds of decode step on the scheduler's own clock: a step's interval runs from
its launch to the next launch (a speculative step is read synchronously, so its interval holds
the drafting, the verify forward and the bookkeeping; an overlapped plain step's holds what the
device and the host take per step, whichever is longer), and its tokens are the output tokens
it appended. Rates are tokens over seconds per request (ratios of decayed sums: a step that
emitted 1 token weighs as little as it produced), per range of batch sizes (1, 2-3, 4-7, ...:
a batch that shrinks as requests finish keeps its history).

Only steady intervals count. Dropped: intervals with another forward in between (a prefill);
the first plain interval after a synchronous step (the pipeline refilling: its launch had
nothing in flight to read); and the first speculative interval after any other step (a plain
step, a prefill). That one pays one-off costs a steady speculative step does not: it reads the
step in flight synchronously (that step's device time lands in its interval, while its token
does not), and the drafter catches up on the tokens of the plain stretch (STANDALONE: an extend
of them through the draft model). Counting it, one such interval judged a probe a loss, so the
waits doubled while speculation won (issue 25 row (b) on the H200: 1.71x -> 1.41x).

Once a batch size has a few speculative samples it needs plain ones too (if plain steps did
not come by themselves, as when every request always drafts, the gate runs a few); when the
speculative rate, over at least two steady intervals, falls below ``min_speedup`` times the
plain rate, speculation is off for ``wait`` steps, then probed again with fresh samples. The
wait is a penalty (16, x4 on each loss up to ``_MAX_WAIT``; halved on each win), lengthened up
to the next penalty when what the probe lost against plain decoding would be more than
``_PROBE_SHARE`` of the plain time in between: the probe's intervals, the dropped first one
included, are a real cost (STANDALONE: its first step extends the draft model over the whole
plain stretch, on the CPU 530-1800 ms against 150-260 ms for a steady step). So a draft that
always loses runs a probe after 16 (or 64), then 4x longer waits: three or four in all.
A loss is hopeless when the rate at full acceptance (``1 + k`` tokens per request per steady
interval) is below the bar too: no acceptance can pay, so the wait is the longest at once,
at that batch size only (the device's costs at that size decided it).
And a drafter whose ``proposal_cost`` (a lower bound in target steps, from the configs: the
model drafting for itself costs ``num_steps``) leaves ``(1 + k) / (1 + cost)`` at or below
``min_speedup`` is hopeless before any measurement: its first probe at each batch size
comes after the longest wait (each STANDALONE probe extends the draft model over the whole
request: a probe per short request made the self-draft 0.69x plain on the H200).
``min_speedup`` 0 turns the gate off. Only when tokens come changes; which tokens (greedy or
sampled: the same distribution) never does. With tensor parallelism each rank times itself,
and rank 0's verdict is broadcast at each comparison (samples are taken at the same steps on
every rank: which intervals count depends on step kinds and forward counts, never the clock),
so the ranks keep deciding alike.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from ..distributed.collectives import broadcast_object

# plain steps between probes after a loss, x4 per loss: a draft that always loses runs about
# log4(steps / 16) probes in all
_MIN_WAIT, _MAX_WAIT, _GROWTH = 16, 1024, 4
# after a loss, the wait is also long enough that the probe's measured loss (its first
# interval's catch-up included) is at most this share of the plain decoding in between
_PROBE_SHARE = 0.03
_SPEC_SAMPLES = 2  # steady speculative intervals before any verdict (after each wait)
_PLAIN_SAMPLES = 2
# a draft that cannot pay even with every draft token accepted (its proposals and verify cost
# more than the tokens they could give): probes after at least the longest wait, and up to
# this many plain steps when the probe's loss would otherwise be more than _PROBE_SHARE
_HOPELESS_MAX_WAIT = 4 * _MAX_WAIT
_KEEP = 0.75  # weight of the older intervals in the decayed sums


@dataclass
class _Rate:
    """Tokens per second over decayed sums of intervals; ``n``: samples since the reset."""

    tokens: float = 0.0
    seconds: float = 0.0
    n: int = 0
    slots: float = 0.0  # tokens had every draft token been accepted (the ceiling)

    def add(self, tokens: float, seconds: float, slots: float = 0.0) -> None:
        keep = _KEEP if self.n else 0.0
        self.tokens = keep * self.tokens + tokens
        self.seconds = keep * self.seconds + seconds
        self.slots = keep * self.slots + slots
        self.n += 1

    @property
    def value(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


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
        self.spec: dict[int, _Rate] = {}
        self.plain: dict[int, _Rate] = {}
        self.wait = 0
        self.penalty = _MIN_WAIT
        self.last: _Step | None = None
        self.off_steps = 0  # plain steps the gate chose (metrics: spec_cost_off_steps)
        self.losses = 0  # comparisons speculation lost (spec_cost_losses)
        self.dropped = 0  # first speculative intervals not counted (spec_cost_first_dropped)
        # seconds of the dropped first and of the counted speculative intervals (their means
        # in the stats: how much a switch from plain costs on this device)
        self.first_seconds = self.steady_seconds = 0.0
        self.steady = 0
        # the current probe's speculative intervals, the first included: (tokens per request,
        # seconds); what it cost against plain decoding sets the wait after a loss
        self._probes: dict[int, list[float]] = {}
        self._now = 0.0  # the current launch's start (``tick``)
        self._after_spec = False  # the step before this launch was a speculative one
        self.last_rates = (0.0, 0.0)  # (speculative, plain) of the last comparison
        self.last_ceiling = 0.0  # the last comparison's speculative rate at full acceptance
        self.hopeless = 0  # verdicts (the prior's included) that not even full acceptance pays
        # per batch bucket, plain steps left after a hopeless verdict: a fact about the
        # device's costs at that batch size (not about the requests running, as a
        # low-acceptance loss, whose wait above holds for every size)
        self.blocked: dict[int, int] = {}
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

    def tick(self, forwards: int) -> None:
        """At a decode launch: close the previous step's interval (``forwards``: the
        scheduler's forward steps so far)."""
        last, self.last = self.last, None
        self._now = self.clock() if self.enabled else 0.0
        adjacent = last is not None and forwards == last.forwards + 1
        self._after_spec = adjacent and last.speculative
        if not self.enabled or not adjacent or last.tokens <= 0:
            return
        # NOTE: no test on the elapsed time itself: whether a sample is taken (and so when
        # the ranks of a TP group compare, below) must not depend on the clock
        elapsed = max(self._now - last.at, 1e-9)
        bucket = _bucket(last.batch)
        if last.speculative:
            probe = self._probes.setdefault(bucket, [0.0, 0.0])
            probe[0] += last.tokens / last.batch
            probe[1] += elapsed
        if not last.steady:
            if last.speculative:
                self.dropped += 1
                self.first_seconds += elapsed
            return
        if last.speculative:
            self.steady += 1
            self.steady_seconds += elapsed
        rates = self.spec if last.speculative else self.plain
        full = 1 + self.k if last.speculative and self.k is not None else 0.0
        rates.setdefault(bucket, _Rate()).add(last.tokens / last.batch, elapsed, full)
        if last.speculative:
            self._judge(bucket)

    def allow(self, batch: int) -> bool:
        """Whether this step may speculate (False: the plain step, counted)."""
        if not self.enabled:
            return True
        bucket = _bucket(batch)
        blocked = self.blocked.setdefault(bucket, self._first_block)
        if blocked > 0:
            self.blocked[bucket] = blocked - 1
            self.off_steps += 1
            return False
        spec, plain = self.spec.get(bucket), self.plain.get(bucket)
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
        appended by it; a plain step's: its batch size; ``refill``: a plain step launched
        with nothing in flight). A speculative step is steady only right after another."""
        if self.enabled:
            steady = self._after_spec if speculative else not refill
            self.last = _Step(self._now, speculative, tokens, batch, forwards, steady)

    def _judge(self, bucket: int) -> None:
        spec, plain = self.spec[bucket], self.plain.get(bucket)
        if spec.n < _SPEC_SAMPLES or plain is None or plain.n < _PLAIN_SAMPLES:
            return
        self.last_rates = (spec.value, plain.value)
        bar = self.min_speedup * plain.value
        loss = spec.value < bar
        # the rate had every draft token been accepted (a step's cost hardly depends on how
        # many were): below the bar, no acceptance can pay at this batch size on this device
        self.last_ceiling = spec.slots / spec.seconds if spec.seconds > 0 else 0.0
        hopeless = loss and self.k is not None and self.last_ceiling < bar
        probe = self._probes.pop(bucket, [0.0, 0.0])
        wait = self._wait(probe, plain.value, hopeless) if loss else 0
        # every TP rank reaches this point at the same step; rank 0's clock decides for all
        loss, wait, hopeless = broadcast_object((loss, wait, hopeless))
        if loss:
            self.losses += 1
            self.spec[bucket] = _Rate()  # measured afresh after the wait
            if hopeless:
                self.hopeless += 1
                self.blocked[bucket] = wait
            else:
                self.wait = wait
                self.penalty = min(_GROWTH * self.penalty, _MAX_WAIT)
        else:
            self.penalty = max(self.penalty // 2, _MIN_WAIT)

    def _wait(self, probe: list[float], plain_rate: float, hopeless: bool) -> int:
        """Plain steps before the next probe after a loss."""
        share = _probe_wait(probe, plain_rate)
        if hopeless:  # acceptance cannot change the verdict: only the device's costs can
            return max(_MAX_WAIT, min(share, _HOPELESS_MAX_WAIT))
        # NOTE: the probe's cost lengthens the wait by one growth step at most: on the GPU a
        # first interval may cost ~10x a steady one, and one losing phase of a request must
        # not keep speculation off for the next thousand steps
        return max(self.penalty, min(share, _GROWTH * self.penalty, _MAX_WAIT))

    def as_dict(self) -> dict:
        spec, plain = self.last_rates
        return {"spec_cost_off_steps": self.off_steps, "spec_cost_losses": self.losses,
                "spec_cost_first_dropped": self.dropped,
                # mean intervals (s): the dropped first speculative ones vs the counted ones
                "spec_cost_first_interval": self.first_seconds / max(self.dropped, 1),
                "spec_cost_steady_interval": self.steady_seconds / max(self.steady, 1),
                # the last comparison's rates (tokens/s per request): what the gate saw
                "spec_cost_spec_rate": spec, "spec_cost_plain_rate": plain,
                # the last comparison's rate at full acceptance; verdicts (and the prior's)
                # that even it could not pay; the prior's bound (tokens per target step)
                "spec_cost_ceiling_rate": self.last_ceiling,
                "spec_cost_hopeless": self.hopeless,
                "spec_cost_prior_ceiling": self.prior_ceiling or 0.0}


def _probe_wait(probe: list[float], plain_rate: float) -> int:
    """Plain steps after which a probe's loss (its intervals' time beyond what plain steps take
    for its tokens; a drafter's catch-up, as STANDALONE's extend of the plain stretch through
    the draft model, included) is ``_PROBE_SHARE`` of the time between."""
    tokens, seconds = probe
    lost = max(seconds - tokens / plain_rate, 0.0) if plain_rate > 0 else 0.0
    return min(int(lost * plain_rate / _PROBE_SHARE), _HOPELESS_MAX_WAIT)


def _bucket(batch: int) -> int:
    """Batch sizes sharing their rates: 1, 2-3, 4-7, 8-15, ... (rates per request)."""
    return batch.bit_length()
