"""PrefillSide: the prefill server's half of disaggregation, driven by the scheduler's loop.

A request with a bootstrap runs its prefill as usual (radix cache, chunking); its first token is
sampled from the prefill's logits (with the grammar mask, whose matcher that token advances).
Then, instead of joining the decode batch, it is held here, its KV locked, until the decode
server named by the room registers for it (``reg/<n>`` in the control store); the transfer
(notice + pages) then runs on the pair's sender thread, and when it is done the request
finishes here (its output: the first token) and its KV goes to the radix cache like any
finished request's. Nothing here blocks the loop: registrations arrive through a listener
thread, transfers end through a queue.

Tensor parallelism: every rank runs this side over the same messages and holds the same
slots, each over its share of the kv heads; rank 0 serves the store and listens. Each decode
rank gets each of its heads from the first prefill rank holding it (``shards.sources``: one
link per such pair, the first writing the notices). Whatever depends on timing (registrations
and peers arriving, rank 0's sends of a request ending, expiry) is rank 0's: it goes out as
``Events`` with the next step's broadcast and every rank applies it there, so every rank starts
a request's sends and frees its slots in the same step (waiting for its own sends of it first).
"""
from __future__ import annotations

import contextlib
import queue
import threading
import time
from typing import Any

from ..errors import KVTransferError
from ..ipc import messages as m
from ..scheduler.output import make_out
from ..scheduler.req import Req, ReqState
from ..distributed.state import get_tp_group
from .admission import short_first
from .link import put, serve_store
from .listener import listen
from .sender import SendJob, SenderLink, notice_of
from .shards import Events, head_range, sources

class PrefillSide:
    def __init__(self, scheduler: Any, config: Any, backend: str) -> None:
        self.sched, self.config = scheduler, config
        self.pool = scheduler.runner.token_kv_pool
        self.timeout = config.disaggregation_timeout_s
        self.port = config.disaggregation_bootstrap_port
        self.backend = backend
        tp = get_tp_group()
        self.rank, self.size = tp.rank, tp.size
        self.kv_heads = int(scheduler.runner.model_config.num_kv_heads)
        self.my_heads = head_range(self.rank, self.size, self.kv_heads)
        if self.rank == 0:  # tp: one store and one listener per server; rank 0 decides
            self.store = serve_store(self.port, self.timeout)  # NOTE: kept alive: the server
            put(self.store, "prefill/info", {"tp_size": self.size, "kv_heads": self.kv_heads})
        self.inbox: queue.Queue = queue.Queue()  # peers and registrations, from the listener
        self.done: queue.Queue = queue.Queue()  # (key, error) of this rank's finished sends
        self.peers: set[str] = set()  # every decode rank announced (served here or not)
        self.links: dict[str, SenderLink] = {}  # the decode ranks this rank sends heads to
        # key -> its registrations (one per rank of a tensor-parallel decode server), arrival
        self.registered: dict[str, tuple[list[dict], float]] = {}
        self.held: dict[str, tuple[Req, float]] = {}  # prefilled, waiting for registration
        self.sending: dict[str, Req | None] = {}  # None: an error notice, no request
        self.parts: dict[str, list] = {}  # key -> [this rank's sends left, first error]
        self.aborted: dict[str, str] = {}  # sending requests aborted meanwhile: their message
        self.cancelled: dict[str, tuple[str, float]] = {}  # keys given up before registration
        self.outbox: list[tuple] = []  # tp: rank 0's events for the next broadcast
        self.counters = dict(pd_transfers_total=0, pd_transfer_failures=0, pd_kv_tokens_sent=0)
        self._stop = False
        if self.rank == 0:
            threading.Thread(target=listen, args=(self.port, self.timeout, self.inbox, self._stopped),
                             name="pd-listen", daemon=True).start()

    # -- the scheduler's hooks ------------------------------------------------------------------
    def holds(self, req: Req) -> bool:
        """A prefilled request whose KV waits for (or travels to) its decode server."""
        boot = req.pd_bootstrap
        if boot is None:
            return False
        held = self.held.get(boot.key)
        return (held is not None and held[0] is req) or self.sending.get(boot.key) is req

    def prefilled(self, reqs: list[Req]) -> None:
        """Sampled their first token: sent now if their decode server has registered (the
        usual case: it registers while the prompt runs), else held until it does.

        NOTE: starting here, not at the next ``poll``, saves the TTFT of a loop iteration:
        on a prefill server the next iteration may first wait for a long prefill's chunk."""
        now = time.monotonic()
        held = False
        for req in reqs:
            if req.pd_bootstrap is None:
                continue
            # grammar: forced tokens after the first one travel as output; the decode side
            # feeds them (it has no KV for them either)
            req.jumped = req.pending_forced = False
            self.held[req.pd_bootstrap.key] = (req, now)
            held = True
        if held:
            if self.size == 1:  # tp: registrations reach every rank with the broadcast
                self._emit([("msg", msg) for msg in self._inbox()])
            self._advance()

    def remove(self, rid: str, message: str) -> Req | None:
        """Abort: a held request is returned for the scheduler to free; a sending one finishes
        when its transfer does (its pages are read until then)."""
        for key, (req, _) in list(self.held.items()):
            if req.rid == rid:
                del self.held[key]
                req.pd_bootstrap = None
                self.cancelled[key] = (message, time.monotonic())
                return req
        for key, req in self.sending.items():
            if req is not None and req.rid == rid:
                self.aborted[key] = message
        return None

    @property
    def busy(self) -> bool:
        return bool(self.held or self.sending)

    def check_idle(self) -> None:
        assert not self.held and not self.sending, (
            f"pd: {len(self.held)} prefilled requests held, {len(self.sending)} sending")

    def stats(self) -> dict:
        return {**self.counters, "pd_held_reqs": len(self.held),
                "pd_sending_reqs": len(self.sending), "pd_decode_peers": len(self.peers)}

    def short_first(self, adder: Any, waiting: list[Req]) -> list[Req]:
        """Beside a chunked prompt, short prompts first (admission.py)."""
        return short_first(adder, waiting)

    def outgoing(self) -> list[Events]:
        """tp: rank 0's events for this step's broadcast (none at tp_size 1)."""
        if not self.outbox:
            return []
        out, self.outbox = [Events(tuple(self.outbox))], []
        return out

    # -- every step ------------------------------------------------------------------------------
    def poll(self) -> None:
        """Rank 0 turns what arrived, ended or expired into events (applied at once at tp_size
        1, by every rank with the next broadcast under tensor parallelism); then every rank
        starts what its state allows, identically."""
        events = self._drain_done()
        if self.rank == 0:
            now = time.monotonic()
            events = [("msg", msg) for msg in self._inbox()] + events
            events += [("expire", k) for k, (_, t) in self.held.items() if now - t > self.timeout]
            events += [("forget", k) for table in (self.registered, self.cancelled)
                       for k, (_, t) in table.items() if now - t > 2 * self.timeout]
            self._emit(events)
        self._advance()

    def apply(self, events: Events) -> None:
        """Every rank, in rank 0's order (``shards.Events``)."""
        for event in events.items:
            kind, key = event[0], event[1]
            if kind == "msg":
                self._take(key)
            elif kind == "finish":
                self._finished(key, event[2])
            elif kind == "expire" and key in self.held:
                req, _ = self.held.pop(key)
                self.cancelled[key] = ("the prefill server gave up waiting", time.monotonic())
                self._finish(req, f"no decode server asked for the KV within {self.timeout:g} s")
            elif kind == "forget":
                self.registered.pop(key, None)
                self.cancelled.pop(key, None)

    def _stopped(self) -> bool:
        return self._stop

    def _emit(self, events: list[tuple]) -> None:
        if self.size == 1:
            self.apply(Events(tuple(events)))
        else:
            self.outbox += events

    def _advance(self) -> None:
        for key in [k for k in self.held if self._complete(k)]:
            req, _ = self.held.pop(key)
            self._start(req, self.registered.pop(key)[0])
        # NOTE: a cancelled key stays (until it expires): more ranks' registrations may come
        for key in [k for k in self.registered if k in self.cancelled]:
            regs, _ = self.registered.pop(key)
            self._notify_only(regs, key, self.cancelled[key][0])

    def _complete(self, key: str) -> bool:
        """Every rank of the decode server registered ``key`` (one, without TP)."""
        regs = self.registered.get(key)
        return regs is not None and len(regs[0]) >= int(regs[0][0].get("shards", 1))

    def _inbox(self) -> list[dict]:
        msgs = []
        while True:
            try:
                msgs.append(self.inbox.get_nowait())
            except queue.Empty:
                return msgs

    def _take(self, msg: dict) -> None:
        """A decode rank's announcement (a link from this rank if it holds heads it needs) or
        a registration."""
        if msg.get("type") != "peer":
            self.registered.setdefault(str(msg["key"]), ([], time.monotonic()))[0].append(msg)
            return
        peer = str(msg["peer"])
        self.peers.add(peer)
        old = self.links.pop(peer, None)
        if old is not None:
            old.close()
        heads = tuple(msg.get("heads") or (0, self.kv_heads))
        if not 0 <= heads[0] < heads[1] <= self.kv_heads:
            plan = [(0, 0, self.kv_heads)]  # rank 0 answers (a layout error: SenderLink)
        else:
            plan = sources(heads, self.size, self.kv_heads)
        mine = [(lo, hi) for rank, lo, hi in plan if rank == self.rank]
        if mine:
            first = self.my_heads[0]
            self.links[peer] = SenderLink(msg, (self._store_host(), self.port), self.backend,
                                          self.timeout, self.pool, self.done, self.rank,
                                          (mine[0][0] - first, mine[0][1] - first),
                                          notices=plan[0][0] == self.rank)

    def _store_host(self) -> str:
        """Where rank 0's store listens as this rank sees it (node 0: --dist-init-addr)."""
        addr = getattr(self.config, "dist_init_addr", None)
        if getattr(self.config, "nnodes", 1) > 1 and addr:
            return str(addr).rsplit(":", 1)[0]
        return "127.0.0.1"

    def _start(self, req: Req, regs: list[dict]) -> None:
        """The notice and pages to every registered rank (each its kv heads)."""
        key = req.pd_bootstrap.key
        unknown = [r["peer"] for r in regs if str(r["peer"]) not in self.peers]
        if unknown:
            self._notify_only(regs, key, f"decode peer {unknown[0]} is unknown to the prefill "
                                         f"server")
            self._finish(req, f"decode peer {unknown[0]} is unknown here")
            return
        start, end = int(regs[0]["start"]), req.prompt_len
        pages = not req.finished and start < end
        slots = (self.sched.memory.host_table[req.req_pool_idx, start:end].clone()
                 if pages else None)
        links = [self.links[str(r["peer"])] for r in regs if str(r["peer"]) in self.links]
        self.sending[key] = req
        self.parts[key] = [len(links), None]
        self.counters["pd_transfers_total"] += 1
        self.counters["pd_kv_tokens_sent"] += end - start if pages else 0
        notice = notice_of(req, key, start, end, pages)
        for link in links:
            link.submit(SendJob(key, notice, slots))
        self._maybe_done(key)

    def _notify_only(self, regs: list[dict], key: str, error: str) -> None:
        known = [str(r["peer"]) for r in regs if str(r["peer"]) in self.peers]
        if not known:
            return
        links = [self.links[p] for p in known if p in self.links and self.links[p].notices]
        if key in self.parts:  # tp: another rank's registration came after the first notice
            self.parts[key][0] += len(links)
        else:
            self.sending[key] = None  # no request: nothing to free
            self.parts[key] = [len(links), None]
        for link in links:
            link.submit(SendJob(key, {"key": key, "error": error}, None))
        self._maybe_done(key)

    def _maybe_done(self, key: str) -> None:
        """tp: rank 0 with nothing (left) to send for ``key``: every rank may finish it."""
        if self.rank == 0 and self.parts[key][0] == 0:
            self._emit([("finish", key, self.parts[key][1])])

    def _drain_done(self) -> list[tuple]:
        events = []
        while True:
            try:
                key, error = self.done.get_nowait()
            except queue.Empty:
                return events
            events += self._note(key, error)

    def _note(self, key: str, error: str | None) -> list[tuple]:
        """One of this rank's sends of ``key`` ended; rank 0's last one: a finish event."""
        part = self.parts.get(key)
        if part is None:
            return []
        part[0] -= 1
        part[1] = part[1] or error
        return [("finish", key, part[1])] if part[0] == 0 and self.rank == 0 else []

    def _finished(self, key: str, error: str | None) -> None:
        """Rank 0's sends of ``key`` ended: every rank (once its own sends of it ended, as
        its slots are freed now) finishes the request."""
        part = self.parts.get(key)
        if part is None:
            return
        deadline = time.monotonic() + self.timeout
        while part[0] > 0:  # tp: another rank's sends, started in the same step as rank 0's
            if time.monotonic() > deadline:
                raise RuntimeError(f"pd: tensor-parallel rank {self.rank}: the KV of {key} was "
                                   f"not sent within {self.timeout:g} s of rank 0's")
            with contextlib.suppress(queue.Empty):  # rank 0: other keys' events go out
                self._emit(self._note(*self.done.get(timeout=1.0)))
        del self.parts[key]
        req = self.sending.pop(key, None)
        if req is not None:
            self._finish(req, error or part[1] or self.aborted.get(key))
        self.aborted.pop(key, None)

    def _finish(self, req: Req, error: str | None) -> None:
        """The request is done here: its KV goes to the radix cache, its output (the first
        token) to the main process."""
        if error is not None:
            self.counters["pd_transfer_failures"] += 1
            req.finish_reason = {"type": "abort", "message": f"disaggregation: {error}",
                                 "status": 503, "kind": KVTransferError.kind}
        elif req.finish_reason is None:
            req.finish_reason = {"type": "length", "length": len(req.output_ids)}
        req.pd_bootstrap = None
        req.state = ReqState.FINISHED
        self.sched.memory.release(req)
        self.sched.send(m.BatchTokenOut([make_out(req)]))
