"""PrefillSide: the prefill server's half of disaggregation, driven by the scheduler's loop.

A request with a bootstrap runs its prefill as usual (radix cache, chunking); its first token is
sampled from the prefill's logits (with the grammar mask, whose matcher that token advances).
Then, instead of joining the decode batch, it is held here, its KV locked, until the decode
server named by the room registers for it (``reg/<n>`` in the control store); the transfer
(notice + pages) then runs on the pair's sender thread, and when it is done the request
finishes here (its output: the first token) and its KV goes to the radix cache like any
finished request's. Nothing here blocks the loop: registrations arrive through a listener
thread, transfers end through a queue.
"""
from __future__ import annotations

import datetime
import json
import queue
import threading
import time
from typing import Any

from ..errors import KVTransferError
from ..ipc import messages as m
from ..scheduler.output import make_out
from ..scheduler.req import Req, ReqState
from .admission import short_first
from .link import STORE_WAIT_S, connect_store, serve_store
from .sender import SendJob, SenderLink

# NOTE: a reg/<n> key still missing this long after later ones exist was reserved by a decode
# process that died before writing it: skipped, or it would stall every registration after it.
SKIP_MISSING_S = 5.0


class PrefillSide:
    def __init__(self, scheduler: Any, config: Any, backend: str) -> None:
        self.sched = scheduler
        self.pool = scheduler.runner.token_kv_pool
        self.timeout = config.disaggregation_timeout_s
        self.port = config.disaggregation_bootstrap_port
        self.backend = backend
        self.store = serve_store(self.port, self.timeout)  # NOTE: kept alive: it is the server
        self.inbox: queue.Queue = queue.Queue()  # peers and registrations, from the listener
        self.done: queue.Queue = queue.Queue()  # (key, error) of finished transfers
        self.links: dict[str, SenderLink] = {}
        # key -> its registrations (one per rank of a tensor-parallel decode server), arrival
        self.registered: dict[str, tuple[list[dict], float]] = {}
        self.held: dict[str, tuple[Req, float]] = {}  # prefilled, waiting for registration
        self.sending: dict[str, Req | None] = {}  # None: an error notice, no request
        self.parts: dict[str, list] = {}  # key -> [transfers left, first error]
        self.aborted: dict[str, str] = {}  # sending requests aborted meanwhile: their message
        self.cancelled: dict[str, tuple[str, float]] = {}  # keys given up before registration
        self.counters = dict(pd_transfers_total=0, pd_transfer_failures=0, pd_kv_tokens_sent=0)
        self._stop = False
        threading.Thread(target=self._listen, name="pd-listen", daemon=True).start()

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
        held = []
        for req in reqs:
            if req.pd_bootstrap is None:
                continue
            # grammar: forced tokens after the first one travel as output; the decode side
            # feeds them (it has no KV for them either)
            req.jumped = req.pending_forced = False
            self.held[req.pd_bootstrap.key] = (req, now)
            held.append(req.pd_bootstrap.key)
        if held:
            self._drain_inbox()
            for key in held:
                if self._complete(key):
                    req, _ = self.held.pop(key)
                    self._start(req, self.registered.pop(key)[0])

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
                "pd_sending_reqs": len(self.sending), "pd_decode_peers": len(self.links)}

    def short_first(self, adder: Any, waiting: list[Req]) -> list[Req]:
        """Beside a chunked prompt, short prompts first (admission.py)."""
        return short_first(adder, waiting)

    def outgoing(self) -> list:
        """Nothing for the scheduler's broadcast (a prefill server runs at tp_size 1)."""
        return []

    # -- every step ------------------------------------------------------------------------------
    def poll(self) -> None:
        self._drain_inbox()
        for key in [k for k in self.held if self._complete(k)]:
            req, _ = self.held.pop(key)
            self._start(req, self.registered.pop(key)[0])
        # NOTE: a cancelled key stays (until it expires): more ranks' registrations may come
        for key in [k for k in self.registered if k in self.cancelled]:
            regs, _ = self.registered.pop(key)
            self._notify_only(regs, key, self.cancelled[key][0])
        self._drain_done()
        self._expire(time.monotonic())

    def _complete(self, key: str) -> bool:
        """Every rank of the decode server registered ``key`` (one, without TP)."""
        regs = self.registered.get(key)
        return regs is not None and len(regs[0]) >= int(regs[0][0].get("shards", 1))

    def _drain_inbox(self) -> None:
        while True:
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                return
            if msg.get("type") == "peer":
                old = self.links.pop(str(msg["peer"]), None)
                if old is not None:
                    old.close()
                self.links[str(msg["peer"])] = SenderLink(msg, self.port, self.backend,
                                                          self.timeout, self.pool, self.done)
            else:
                key = str(msg["key"])
                self.registered.setdefault(key, ([], time.monotonic()))[0].append(msg)

    def _start(self, req: Req, regs: list[dict]) -> None:
        """The notice and pages to every registered rank (each its kv heads)."""
        key = req.pd_bootstrap.key
        unknown = [r["peer"] for r in regs if str(r["peer"]) not in self.links]
        if unknown:
            self._notify_only(regs, key, f"decode peer {unknown[0]} is unknown to the prefill "
                                         f"server")
            self._finish(req, f"decode peer {unknown[0]} is unknown here")
            return
        start, end = int(regs[0]["start"]), req.prompt_len
        pages = not req.finished and start < end
        slots = (self.sched.memory.host_table[req.req_pool_idx, start:end].clone()
                 if pages else None)
        self.sending[key] = req
        self.parts[key] = [len(regs), None]
        self.counters["pd_transfers_total"] += 1
        self.counters["pd_kv_tokens_sent"] += end - start if pages else 0
        notice = _notice(req, key, start, end, pages)
        for reg in regs:
            self.links[str(reg["peer"])].submit(SendJob(key, notice, slots))

    def _notify_only(self, regs: list[dict], key: str, error: str) -> None:
        links = [self.links[str(r["peer"])] for r in regs if str(r["peer"]) in self.links]
        if not links:
            return
        if key in self.parts:  # tp: another rank's registration came after the first notice
            self.parts[key][0] += len(links)
        else:
            self.sending[key] = None  # no request: nothing to free
            self.parts[key] = [len(links), None]
        for link in links:
            link.submit(SendJob(key, {"key": key, "error": error}, None))

    def _drain_done(self) -> None:
        while True:
            try:
                key, error = self.done.get_nowait()
            except queue.Empty:
                return
            part = self.parts.get(key)
            if part is None:
                continue
            part[0] -= 1
            part[1] = part[1] or error
            if part[0] > 0:
                continue  # tp: other ranks' transfers still run
            del self.parts[key]
            req = self.sending.pop(key, None)
            if req is not None:
                self._finish(req, part[1] or self.aborted.pop(key, None))
            self.aborted.pop(key, None)

    def _expire(self, now: float) -> None:
        for key, (req, since) in list(self.held.items()):
            if now - since > self.timeout:
                del self.held[key]
                self.cancelled[key] = ("the prefill server gave up waiting", now)
                self._finish(req, f"no decode server asked for the KV within {self.timeout:g} s")
        for table in (self.registered, self.cancelled):
            for key in [k for k, (_, t) in table.items() if now - t > 2 * self.timeout]:
                del table[key]

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

    # -- the listener thread ---------------------------------------------------------------------
    def _listen(self) -> None:
        """Reads ``reg/1``, ``reg/2``... (peers announcing themselves, registrations) into
        the inbox, in order."""
        store = connect_store("127.0.0.1", self.port, self.timeout)
        n, missing_since = 1, None
        while not self._stop:
            key = f"reg/{n}"
            try:
                store.wait([key], datetime.timedelta(seconds=STORE_WAIT_S))
            except RuntimeError:  # timed out: is an earlier reservation never written?
                if int(store.add("reg_n", 0)) > n:
                    missing_since = missing_since or time.monotonic()
                    if time.monotonic() - missing_since > SKIP_MISSING_S:
                        n, missing_since = n + 1, None
                continue
            self.inbox.put(json.loads(store.get(key)))
            store.delete_key(key)
            n, missing_since = n + 1, None


def _notice(req: Req, key: str, start: int, end: int, pages: bool) -> dict:
    """What the decode side needs besides the pages: the output so far (the first token, and
    any forced tokens after it), how it finished if it did, the prompt statistics and the
    logprobs computed here."""
    notice = {"key": key, "output_ids": list(req.output_ids), "finish_reason": req.finish_reason,
              "cached_tokens": req.cached_tokens, "forced_positions": list(req.forced_positions),
              "start": start, "count": end - start, "pages": pages}
    if req.return_logprob:
        notice.update(input_token_logprobs=req.input_token_logprobs,
                      input_top_logprobs=req.input_top_logprobs,
                      output_token_logprobs=req.output_token_logprobs,
                      output_top_logprobs=req.output_top_logprobs)
    return notice
