"""What the router believes a worker still has to compute, in tokens: the worker's last
``GET /load`` report plus the requests the router sent it since that report was asked for.

Why both: a report is a few tens of milliseconds old when it arrives, and a burst of requests
routed in between would all see the same stale numbers and go to the same worker. So every
request the router sends is *booked* on its worker with its estimated work at once (optimistic
accounting), and a booking counts on top of a report only if it was made after that report was
requested (before, the worker already counted it). A worker without ``/load`` (e.g. SGLang's
server, or before the first report) is judged by the router's bookings alone.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

_tickets = itertools.count(1)


@dataclass(frozen=True)
class LoadReport:
    """One ``GET /load`` answer (see runtime/server/load.py)."""

    waiting_reqs: int = 0
    running_reqs: int = 0
    prefill_tokens: int = 0  # prompt tokens still to prefill (uncached)
    decode_tokens: int = 0  # output tokens still to decode
    kv_usage: float = 0.0
    kv_total: int = 0  # KV slots in all: a bound on what the worker's prefix cache can hold
    kv_free: int = 0  # slots neither used nor caching: 0 means a new prefix evicts an old one
    prompt_tokens_total: int = 0

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> "LoadReport":
        return cls(int(body.get("num_waiting_reqs", 0)), int(body.get("num_running_reqs", 0)),
                   int(body.get("queued_prefill_tokens", 0)),
                   int(body.get("remaining_decode_tokens", 0)), float(body.get("kv_usage", 0.0)),
                   int(body.get("kv_total_slots", 0)), int(body.get("kv_free_slots", 0)),
                   int(body.get("prompt_tokens_total", 0)))

    @property
    def kv_pressure(self) -> float:
        """The fraction of the KV not free (requests' and cached): how likely a new prefix
        evicts a cached one."""
        return 1.0 - self.kv_free / self.kv_total if self.kv_total else 0.0


@dataclass(frozen=True)
class Booking:
    ticket: int
    prefill: float  # uncached prompt tokens the router expects the worker to compute
    decode: float  # output tokens it expects the worker to decode
    epoch: int  # the ledger's report epoch when it was booked


@dataclass
class WorkLedger:
    report: LoadReport | None = None
    supported: bool = True  # False once the worker answered /load with 404 (not an sgdsl server)
    epoch: int = 0  # bumped when a report is requested; bookings from then on are not in it
    report_epoch: int = -1  # the epoch at which the current report was requested
    bookings: dict[int, Booking] = field(default_factory=dict)

    def book(self, prefill: float, decode: float) -> int:
        """Count a request just sent; the ticket releases it when its answer has ended."""
        ticket = next(_tickets)
        self.bookings[ticket] = Booking(ticket, prefill, decode, self.epoch)
        return ticket

    def release(self, ticket: int) -> None:
        self.bookings.pop(ticket, None)

    def requested(self) -> int:
        """A report is being asked for: returns the epoch to hand to ``apply``."""
        self.epoch += 1
        return self.epoch

    def apply(self, report: LoadReport, epoch: int) -> None:
        """A report requested at ``epoch`` arrived (an older one than the current is dropped)."""
        if epoch > self.report_epoch:
            self.report, self.report_epoch = report, epoch

    def work(self, decode_weight: float) -> float:
        """Outstanding work: prefill tokens + ``decode_weight`` x decode tokens."""
        fresh = self.bookings.values()
        base = 0.0
        if self.report is not None:
            r = self.report
            base = r.prefill_tokens + decode_weight * r.decode_tokens
            fresh = [b for b in fresh if b.epoch >= self.report_epoch]
        return base + sum(b.prefill + decode_weight * b.decode for b in fresh)

    def describe(self) -> dict[str, Any]:
        r = self.report
        return {"booked": len(self.bookings), "report": None if r is None else {
            "waiting_reqs": r.waiting_reqs, "running_reqs": r.running_reqs,
            "prefill_tokens": r.prefill_tokens, "decode_tokens": r.decode_tokens,
            "kv_usage": round(r.kv_usage, 4)}}
