"""A modelled sgdsl server for benchmarks/router_sim.py: the scheduler's own admission, eviction
and step rules (runtime/scheduler/scheduler.py, prefill.py, policy.py, stepping.py), with step
times instead of forwards.

What it copies from the scheduler, because the routing policies' ratios hinge on it:
- prefill first: a step is an extend of at most ``chunk`` tokens (2048, the server's
  ``chunked_prefill_size``) whenever a waiting request can be admitted, else a decode step of
  every running request; an extend decodes nothing (no mixed batches);
- LPM order (the longest cached prefix first; FCFS past 128 waiting), retracted requests first;
  requests of one uncached prefix in one extend wait a round (in-batch prefix sharing);
- admission keeps ``new_token_ratio`` x the running requests' remaining output free (0.7,
  -0.001 a decode step down to 0.1, back to 0.7 on a retraction); a decode step that finds too
  few free slots retracts the latest arrival (its KV goes to the cache, it queues again);
- the prefix cache is the radix tree's LRU over leaves: a group's prefix (cached as soon as
  its chunk is computed), and every released request's own tokens (question + output) as a
  leaf under it, evicted oldest first; prefixes held by admitted requests cannot go;
- ``/load`` as runtime/server/load.py computes it (queued prefill from the last LPM pass).

Decode reads the KV of distinct prefixes once (cascade attention, batches of >= 16).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from sgdsl.runtime.router.ledger import LoadReport

LPM_MAX_QUEUE = 128  # runtime/scheduler/policy.py
IN_BATCH_CHECK = 32  # runtime/scheduler/prefill.py
RESERVE_CAP = 4096
INIT_RATIO, RATIO_DECAY, MIN_RATIO = 0.7, 0.001, 0.1  # scheduler.py, stepping.py
CASCADE_MIN_BS = 16  # runtime/model/cuda_graph_runner.py


@dataclass(frozen=True)
class Timing:
    """Step times of one replica (H200, dummy Llama-3.1-8B; fitted in RESULTS.md)."""
    extend_s: float = 0.003  # fixed cost of an extend step
    prefill_s: float = 17.5e-6  # per prefilled token
    decode_step_s: float = 0.004  # fixed cost of a decode step (weights, launch, sampling)
    decode_s: float = 25e-6  # per decoding request
    kv_read_s: float = 3e-8  # per KV token a decode step reads
    request_s: float = 0.01  # host time per admitted or finished request the device waits for
    chunk: int = 2048  # the server's chunked_prefill_size
    poll_s: float = 0.1  # the router's --load-interval-s
    max_running: int = 256


@dataclass(eq=False)
class Req:
    group: int
    prefix: int  # the group's shared tokens
    prompt: int  # prefix + question
    output: int
    arrival: int
    done_cb: object = None
    generated: int = 0
    kv: int = 0  # tokens with KV (cached prefix part + own)
    base: int = 0  # prefix tokens held through the group's cache entry (locked)
    own: int = 0  # KV slots the request holds itself
    match: int = 0  # the last LPM pass's cached length (for /load)
    retractions: int = 0
    hit: int = -1  # cached tokens at first admission (-1: not admitted yet)

    @property
    def seq_len(self) -> int:
        return self.prompt + self.generated


@dataclass
class Replica:
    kv_tokens: int
    timing: Timing
    lru: OrderedDict = field(default_factory=OrderedDict)  # ("p", group) / ("t", req) -> tokens
    locks: dict = field(default_factory=dict)  # group -> admitted requests holding its prefix
    cached: int = 0  # slots of the LRU's entries
    private: int = 0  # slots held by admitted requests themselves
    waiting: list = field(default_factory=list)
    running: list = field(default_factory=list)
    chunked: Req | None = None
    ratio: float = INIT_RATIO
    busy: bool = False
    step_reqs: list = field(default_factory=list)  # (req, tokens) of the extend in flight
    hit_tokens: int = 0
    prompt_tokens: int = 0
    served: int = 0
    retracted: int = 0
    host_reqs: int = 0  # requests admitted or finished whose host work is not yet timed
    groups: set = field(default_factory=set)  # groups sent here

    # -- memory ---------------------------------------------------------------------------------
    def _locked(self) -> int:
        return sum(self.lru.get(("p", g), 0) for g, n in self.locks.items() if n)

    def available(self) -> int:
        """Free + evictable slots (memory.available())."""
        return self.kv_tokens - self.private - self._locked()

    def _alloc(self, n: int) -> bool:
        """Take ``n`` slots, evicting the least recently used unlocked entries as needed."""
        if self.available() < n:
            return False
        if self.kv_tokens - self.cached - self.private >= n:
            self.private += n
            return True
        for key in list(self.lru):
            if self.kv_tokens - self.cached - self.private >= n:
                break
            if key[0] == "p" and self.locks.get(key[1]):
                continue
            self.cached -= self.lru.pop(key)
        self.private += n
        return True

    def _matched(self, r: Req) -> int:
        cached = self.lru.get(("p", r.group), 0)
        if cached == r.prefix and ("t", r) in self.lru:
            return cached + self.lru[("t", r)]
        return cached

    def _lock(self, r: Req, upto: int) -> None:
        if r.base == 0 and upto > 0:
            self.locks[r.group] = self.locks.get(r.group, 0) + 1
        r.base = upto

    def _release(self, r: Req) -> None:
        """Finished or retracted: its own KV becomes a leaf under its prefix (LRU order: the
        leaf, then the prefix, just used)."""
        if r.own:
            self.lru[("t", r)] = r.own
            self.cached += r.own
            self.private -= r.own
        if r.base:
            self.locks[r.group] -= 1
        if ("p", r.group) in self.lru:
            self.lru.move_to_end(("p", r.group))
        r.kv = r.base = r.own = 0

    # -- scheduling -----------------------------------------------------------------------------
    def add(self, r: Req) -> None:
        self.waiting.append(r)
        self.groups.add(r.group)

    def _order(self) -> list[Req]:
        if len(self.waiting) <= LPM_MAX_QUEUE:
            for r in self.waiting:  # each match refreshes the prefix's LRU time (radix.py)
                r.match = self._matched(r)
                if ("p", r.group) in self.lru:
                    self.lru.move_to_end(("p", r.group))
            return sorted(self.waiting, key=lambda r: (r.retractions == 0, -r.match, r.arrival))
        return sorted(self.waiting, key=lambda r: (r.retractions == 0, r.arrival))

    def _schedule_prefill(self) -> list[tuple[Req, int]]:
        if not self.waiting and self.chunked is None:
            return []
        budget = self.timing.chunk
        max_new = self.timing.max_running - len(self.running)
        reserve = sum(int(min(r.output - r.generated, RESERVE_CAP) * self.ratio)
                      for r in self.running)
        rem = self.available() - reserve
        taken: list[tuple[Req, int]] = []
        if self.chunked is not None:
            r = self.chunked
            n = min(r.seq_len - r.kv, budget)
            if not self._alloc(n):
                return []
            taken.append((r, n))
            r.own += n
            return taken if r.kv + n < r.seq_len else self._more(taken, budget - n, max_new, rem)
        return self._more(taken, budget, max_new, rem)

    def _more(self, taken: list, budget: int, max_new: int, rem: int) -> list[tuple[Req, int]]:
        signatures = set()
        self.chunked = None
        for r in self._order():
            if budget <= 0 or len(taken) >= max_new:
                break
            match = self._matched(r)
            extend = r.seq_len - match
            if extend > IN_BATCH_CHECK:
                sig = (match, r.group) if match < r.prefix else (match, id(r))
                if sig in signatures:
                    continue
                signatures.add(sig)
            n = min(extend, budget)
            future = int(min(r.output - r.generated, RESERVE_CAP) * self.ratio)
            need = n + (future if n == extend else 0)
            if need > rem and (taken or self.available() < need):
                break
            if not self._admit(r, match, n):
                break
            taken.append((r, n))
            budget -= n
            rem -= need
            if n < extend:
                self.chunked = r
                break
        admitted = {id(r) for r, _ in taken}
        self.waiting = [r for r in self.waiting if id(r) not in admitted]
        return taken

    def _admit(self, r: Req, match: int, n: int) -> bool:
        key = ("p", r.group)
        if key in self.lru:
            self.lru.move_to_end(key)
        prefix = min(match, r.prefix)
        self._lock(r, prefix)
        tail = match - prefix
        if tail:  # a retracted request's own tokens are still cached: they are its own again
            self.cached -= self.lru.pop(("t", r))
            self.private += tail
        if not self._alloc(n):
            self.private -= tail
            self.lru[("t", r)] = tail
            self.cached += tail
            self._release(r)
            return False
        r.kv, r.own = match, tail + n
        if r.hit < 0:
            self.host_reqs += 1
            r.hit = match
            self.hit_tokens += match
            self.prompt_tokens += r.prompt
        return True

    # -- steps ------------------------------------------------------------------------------------
    def step(self) -> float:
        """Start a step; returns its duration (0 with nothing to do)."""
        t = self.timing
        self.step_reqs = self._schedule_prefill()
        if self.step_reqs:
            return (t.extend_s + t.prefill_s * sum(n for _, n in self.step_reqs)
                    + t.request_s * self._host_reqs())
        self._make_room_for_decode()
        if not self.running:
            return 0.0
        self._alloc(len(self.running))
        host = t.request_s * self._host_reqs()
        for r in self.running:
            r.own += 1
        bs = len(self.running)
        if bs >= CASCADE_MIN_BS:
            groups = {r.group for r in self.running}
            read = sum(self.lru.get(("p", g), 0) for g in groups)
            read += sum(r.kv - r.base for r in self.running)
        else:
            read = sum(r.kv for r in self.running)
        self.ratio = max(self.ratio - RATIO_DECAY, MIN_RATIO)
        return host + t.decode_step_s + t.decode_s * bs + t.kv_read_s * read

    def _host_reqs(self) -> int:
        """Requests admitted for the first time or finished since the last step."""
        n, self.host_reqs = self.host_reqs, 0
        return n

    def _make_room_for_decode(self) -> None:
        while self.running and self.available() < len(self.running):
            if self.chunked is not None:
                victim, self.chunked = self.chunked, None
            else:
                victim = max(self.running, key=lambda r: (r.arrival, -r.generated))
                self.running.remove(victim)
            self._release(victim)
            victim.retractions += 1
            self.retracted += 1
            self.waiting.append(victim)
            self.ratio = max(self.ratio, INIT_RATIO)

    def end_step(self) -> list[Req]:
        """The step's effects; returns the requests that finished."""
        finished = []
        if self.step_reqs:
            for r, n in self.step_reqs:
                r.kv += n
                self._cache_chunk(r)
                if r.kv >= r.seq_len:  # the extend samples its first (next) token
                    self.running.append(r)
                    self._token(r, finished)
            self.step_reqs = []
        else:
            for r in list(self.running):
                r.kv += 1
                self._token(r, finished)
        return finished

    def _token(self, r: Req, finished: list) -> None:
        r.generated += 1
        if r.generated >= r.output:
            self.running.remove(r)
            self._release(r)
            self.served += 1
            self.host_reqs += 1
            finished.append(r)

    def _cache_chunk(self, r: Req) -> None:
        """The computed part of the group's prefix goes to the cache at once (cache_chunk);
        a part another request cached meanwhile is freed (the tree keeps one copy)."""
        upto = min(r.kv, r.prefix)
        if upto <= r.base:
            return
        key = ("p", r.group)
        have = self.lru.get(key, 0)
        if upto > have:
            self.lru[key] = upto
            self.cached += upto - have
        self.lru.move_to_end(key)
        moved = upto - r.base
        r.own -= moved
        self.private -= moved
        self._lock(r, upto)

    def report(self) -> LoadReport:
        """GET /load (runtime/server/load.py from Scheduler.stats)."""
        prefill = sum(max(r.seq_len - r.match, 0) for r in self.waiting)
        if self.chunked is not None:
            prefill += self.chunked.seq_len - self.chunked.kv
        reqs = [*self.waiting, *self.running, *([self.chunked] if self.chunked else [])]
        decode = sum(r.output - r.generated for r in reqs)
        free = self.kv_tokens - self.cached - self.private
        evictable = self.cached - self._locked()
        usage = (self.kv_tokens - free - evictable) / self.kv_tokens
        return LoadReport(len(self.waiting), len(self.running) + (self.chunked is not None),
                          prefill, decode, usage, self.kv_tokens, free)
