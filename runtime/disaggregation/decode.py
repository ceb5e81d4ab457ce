"""DecodeSide: the decode server's half of disaggregation, driven by the scheduler's loop.

A request with a bootstrap skips the prefill here. It gets a table row and KV slots as an
extend would (``PrefillAdder``: the same admission rule, and its cached prefix on this server
is reused, so only the rest travels), registers with its prefill server (``ReceiverLink``),
and waits. When the prefill side's notice and pages have landed, the request is "prebuilt":
its prompt's KV is in place (handed to this server's radix cache like a computed chunk), its
output holds the first token(s) sampled by the prefill server (the grammar's matcher here is
advanced over them), and it joins the running batch as a request that has just sampled. From
then on it is an ordinary decoding request: retracted under memory pressure, it resumes by a
local prefill.

Tensor parallelism: every rank runs this side over the same messages (the scheduler's), holds
the same slots and registers each request with the prefill server for its kv heads; the pages
land on each rank at its own pace. So that every rank lets a request join (or fails it) in the
same step, rank 0 alone decides: what it saw land or fail goes out as a ``Verdicts`` message
with the next step's broadcast, and each rank acts on it there, first waiting for its own
pages of those requests if they are still in flight (they were sent with rank 0's).
"""
from __future__ import annotations

import queue
import time
import uuid
from typing import Any

import torch

from ..errors import KVTransferError
from ..layers.upload import to_device
from ..multimodal.mrope import set_row_deltas
from ..scheduler.prefill import PrefillAdder
from ..distributed.state import get_tp_group
from ..scheduler.req import Req, ReqState
from .receiver import ReceiverLink
from .shards import Verdicts, head_range

_EMPTY = torch.empty(0, dtype=torch.int64)
_NO_BUDGET = 1 << 62  # admission here is bounded by memory and rows, not by a token budget


class DecodeSide:
    def __init__(self, scheduler: Any, config: Any, backend: str) -> None:
        self.sched = scheduler
        self.pool = scheduler.runner.token_kv_pool
        self.timeout = config.disaggregation_timeout_s
        self.backend = backend
        self.my_id = uuid.uuid4().hex
        self.links: dict[tuple[str, int], ReceiverLink] = {}
        self.queued: list[Req] = []  # waiting for slots
        self.waiting_kv: dict[str, tuple[Req, ReceiverLink, float]] = {}
        self.zombies: dict[str, tuple[Req, str]] = {}  # aborted while their pages landed
        self.done: queue.Queue = queue.Queue()
        tp = get_tp_group()
        self.rank, self.size = tp.rank, tp.size
        self.kv_heads = int(scheduler.runner.model_config.num_kv_heads)
        self.heads = head_range(self.rank, self.size, self.kv_heads)
        self.arrived: dict[str, dict] = {}  # tp: notices of this rank not yet decided on
        self.outbox: list[tuple[str, str, str]] = []  # tp: rank 0's verdicts for the broadcast
        self.failing: set[str] = set()  # tp: keys rank 0 has sent a "fail" verdict for
        self.counters = dict(pd_transfers_total=0, pd_transfer_failures=0,
                             pd_kv_tokens_received=0)
        self._links_made = 0

    # -- the scheduler's hooks ------------------------------------------------------------------
    def holds(self, req: Req) -> bool:
        return False

    def prefilled(self, reqs: list[Req]) -> None:
        """Nothing: requests prefilled here (no bootstrap, or resumed) decode here."""

    def remove(self, rid: str, message: str) -> Req | None:
        for req in self.queued:
            if req.rid == rid:
                self.queued.remove(req)
                return req
        for key, (req, link, _) in list(self.waiting_kv.items()):
            if req.rid == rid:
                del self.waiting_kv[key]
                req.pd_bootstrap = None
                if self.size > 1:  # tp: freed on every rank now, its pages in flight waited for
                    self._settle(key, link)
                    return req
                if link.cancel(key):
                    return req  # the scheduler frees its slots (no KV in them: not cached)
                self.zombies[key] = (req, message)  # freed once its pages stop landing
        return None

    @property
    def busy(self) -> bool:
        return bool(self.queued or self.waiting_kv or self.zombies)

    def check_idle(self) -> None:
        assert not self.busy, (f"pd: {len(self.queued)} queued, {len(self.waiting_kv)} "
                               f"waiting for KV, {len(self.zombies)} aborted mid-transfer")

    def stats(self) -> dict:
        return {**self.counters, "pd_queued_reqs": len(self.queued),
                "pd_waiting_kv_reqs": len(self.waiting_kv),
                "pd_kv_tokens_in_place": sum(k.in_place_tokens for k in self.links.values())}

    # -- every step ------------------------------------------------------------------------------
    def poll(self) -> None:
        s = self.sched
        if any(r.pd_bootstrap is not None for r in s.waiting):
            self.queued += [r for r in s.waiting if r.pd_bootstrap is not None]
            s.waiting = [r for r in s.waiting if r.pd_bootstrap is None]
        if self.queued:
            self._allocate()
        ready = self._drain_done()
        if self.rank == 0:  # tp: timeouts are rank 0's decisions (Verdicts)
            self._expire(time.monotonic())
        if ready:
            join_prebuilt(s, ready)

    # -- tensor parallelism: rank 0 decides, every rank applies ----------------------------------
    def outgoing(self) -> list[Verdicts]:
        """Rank 0's verdicts for this step's broadcast (none at tp_size 1)."""
        if not self.outbox:
            return []
        out, self.outbox = [Verdicts(tuple(self.outbox))], []
        return out

    def apply(self, verdicts: Verdicts) -> None:
        """Every rank, the same step: requests join or fail as rank 0 saw their transfers end."""
        ready = []
        for key, kind, message in verdicts.items:
            self.failing.discard(key)
            entry = self.waiting_kv.pop(key, None)
            if entry is None:  # aborted meanwhile: every rank freed it then
                self.arrived.pop(key, None)
                continue
            req, link, _ = entry
            if kind == "fail":
                self._settle(key, link)
                self._fail(req, message)
                continue
            notice = self._own_notice(key)
            if notice.get("error"):  # NOTE: the ranks would diverge: this rank's engine fails
                raise RuntimeError(f"pd: tensor-parallel rank {self.rank}: the KV of {key} "
                                   f"failed here but landed on rank 0: {notice['error']}")
            if self._landed(req, notice):
                ready.append(req)
        if ready:
            join_prebuilt(self.sched, ready)

    def _settle(self, key: str, link: ReceiverLink) -> None:
        """tp: this rank's transfer of ``key`` is over (cancelled before its pages started,
        or waited for) and its notice dropped: the slots can be freed now on every rank."""
        if not link.cancel(key):
            self._own_notice(key)
        self.arrived.pop(key, None)

    def _own_notice(self, key: str) -> dict:
        """tp: this rank's notice of ``key``, waiting for its pages if they are in flight."""
        deadline = time.monotonic() + self.timeout
        while key not in self.arrived:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"pd: tensor-parallel rank {self.rank}: the KV of {key} did "
                                   f"not arrive within {self.timeout:g} s of rank 0's")
            try:
                got, notice = self.done.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if got == key or got in self.waiting_kv:
                self.arrived[got] = notice
        return self.arrived.pop(key)

    def _allocate(self) -> None:
        s = self.sched
        holding = [r for r, _, _ in self.waiting_kv.values()]
        adder = PrefillAdder(s.memory, _NO_BUDGET,
                             s.max_running - len(s.running) - len(holding),
                             s.running.reqs + holding, s.ratio)
        for req in self.queued:
            if not adder.add(req):
                break
        admitted = {id(r) for r in adder.reqs}
        self.queued = [r for r in self.queued if id(r) not in admitted]
        for req in adder.reqs:
            self._register(req)

    def _register(self, req: Req) -> None:
        link = self._link(req.pd_bootstrap.address)
        if link.error is not None and self.size == 1:
            self._fail(req, link.error)
            return
        key = req.pd_bootstrap.key
        if link.error is None:  # tp: else rank 0 fails it (_expire), on every rank
            link.register(key, req.extend_slots.clone(), req.kv_len)
        self.waiting_kv[key] = (req, link, time.monotonic())
        self.counters["pd_transfers_total"] += 1

    def _link(self, address: tuple[str, int]) -> ReceiverLink:
        link = self.links.get(address)
        if link is None or (link.error is not None and link.receiver_exited):
            if link is not None:
                link.close()
            self._links_made += 1  # NOTE: a fresh id: the old group's rendezvous keys remain
            link = ReceiverLink(address[0], address[1], f"{self.my_id}-{self._links_made}",
                                self.backend, self.timeout, self.pool, self.done,
                                self.heads, self.kv_heads, self.size)
            self.links[address] = link
        return link

    def _drain_done(self) -> list[Req]:
        ready = []
        while True:
            try:
                key, notice = self.done.get_nowait()
            except queue.Empty:
                return ready
            if key in self.zombies:
                req, message = self.zombies.pop(key)
                self._finish(req, {"type": "abort", "message": message})
                continue
            if self.size > 1:  # tp: noted; rank 0 tells every rank what to do with it
                if key in self.waiting_kv:
                    self.arrived[key] = notice
                    if self.rank == 0:
                        error = notice.get("error")
                        self.outbox.append((key, "fail", str(error)) if error else
                                           (key, "landed", ""))
                        self.failing.update([key] if error else [])
                continue
            entry = self.waiting_kv.pop(key, None)
            if entry is not None and self._landed(entry[0], notice):
                ready.append(entry[0])

    def _landed(self, req: Req, notice: dict) -> bool:
        """The notice (and pages) of ``req`` arrived; True if it now decodes here."""
        if notice.get("error"):
            self._fail(req, str(notice["error"]))
            return False
        req.pd_bootstrap = None
        req.output_ids = [int(t) for t in notice["output_ids"]]
        req.cached_tokens = int(notice.get("cached_tokens", req.cached_tokens))
        req.forced_positions = list(notice.get("forced_positions") or [])
        if req.return_logprob:
            for name in ("input_token_logprobs", "input_top_logprobs", "output_token_logprobs",
                         "output_top_logprobs"):
                setattr(req, name, notice.get(name) or [])
            req.input_logprobs_done = True
        if notice.get("pages"):
            self.counters["pd_kv_tokens_received"] += req.extend_len
            req.kv_len += req.extend_len
            req.extend_len, req.extend_slots = 0, _EMPTY
            self.sched.memory.cache_chunk(req)  # the prompt's KV now in this radix cache
        if notice.get("finish_reason"):
            self._finish(req, notice["finish_reason"])
            return False
        if req.grammar is not None and not req.grammar.accept_tokens(req.output_ids):
            self._fail(req, "the grammar here rejects the prefill server's first token")
            return False
        # grammar: forced tokens after the first have no KV yet: the next step feeds them
        req.pending_forced = len(req.output_ids) > 1
        return True

    def _expire(self, now: float) -> None:
        for key, (req, link, since) in list(self.waiting_kv.items()):
            if link.error is None and now - since <= self.timeout:
                continue
            if self.size > 1:  # tp: a verdict, applied on every rank
                if key not in self.failing and key not in self.arrived:
                    self.failing.add(key)
                    self.outbox.append((key, "fail", link.error or f"the prefill server sent "
                                        f"no KV within {self.timeout:g} s"))
                continue
            if not link.cancel(key):
                continue  # pages landing: the gloo/NCCL timeout ends that
            del self.waiting_kv[key]
            self._fail(req, link.error or f"the prefill server sent no KV within "
                                          f"{self.timeout:g} s")

    def _fail(self, req: Req, message: str) -> None:
        self.counters["pd_transfer_failures"] += 1
        self._finish(req, {"type": "abort", "message": f"disaggregation: {message}",
                           "status": 503, "kind": KVTransferError.kind})

    def _finish(self, req: Req, reason: dict) -> None:
        """Finished without decoding here: slots without pages are freed, not cached."""
        req.pd_bootstrap = None
        req.finish_reason = reason
        self.sched._finish_and_send([req])


def join_prebuilt(s: Any, reqs: list[Req]) -> None:
    """Prebuilt requests join the running batch as if they had just sampled their first token
    here: sampling rows (penalties and seeded steps continue from their output), the token
    the next decode step feeds, and the first token's output (streams see it now)."""
    for req in reqs:
        req.state = ReqState.DECODING
    vocab = int(s.runner.model_config.vocab_size)
    info = s.sampler.new_info(reqs, vocab)
    rows = to_device(torch.tensor([r.req_pool_idx for r in reqs]), s.device)
    set_row_deltas(s.runner.model, reqs, rows)  # mm: M-RoPE decode positions (no prefill here)
    last = to_device(torch.tensor([r.output_ids[-1] for r in reqs]), s.device)
    s.running.record_tokens(rows, last)
    s.running.merge(reqs, info)
    s._finish_and_send(reqs)
