"""PrefillAdder: picks the requests of one extend (prefill) batch under a token budget.

Each admitted request skips its cached prefix; a prompt longer than what is left of the budget
is cut into chunks (at most one chunked request at a time, continued first on the next pass).
Admission also keeps room for the decode tokens of running requests (``new_token_ratio`` of
what they may still generate), evicting unlocked cache entries when the pool runs short.
"""
from __future__ import annotations

from .memory import KVMemory
from .req import Req, ReqState

# NOTE: requests whose uncached tokens start with the same IN_BATCH_CHECK tokens as a request
# already in this batch wait one round: the first one's KV is then cached and shared, instead of
# the same prefix being computed many times in one batch (few-shot prompts arriving together).
IN_BATCH_CHECK = 32
# NOTE: the decode reservation counts at most this many future tokens per request, so one
# request with a huge max_new_tokens does not block admission forever.
RESERVE_CAP = 4096


class PrefillAdder:
    def __init__(self, memory: KVMemory, token_budget: int, max_new_reqs: int,
                 running: list[Req], new_token_ratio: float) -> None:
        self.memory = memory
        self.budget = token_budget
        self.max_new_reqs = max_new_reqs
        self.ratio = new_token_ratio
        reserve = sum(self._future_tokens(r) for r in running)
        self.rem_total = memory.available() - reserve
        self.reqs: list[Req] = []
        self.chunked: Req | None = None
        self._signatures: set[tuple] = set()

    def _future_tokens(self, req: Req) -> int:
        return int(min(req.remaining_tokens, RESERVE_CAP) * self.ratio)

    @property
    def full(self) -> bool:
        return self.budget <= 0 or len(self.reqs) >= self.max_new_reqs or self.chunked is not None

    def add_chunked(self, req: Req) -> bool:
        """Continue a request whose prompt is being prefilled in chunks."""
        n = min(req.seq_len - req.kv_len, self.budget)
        if n <= 0 or self.memory.reserve_extend(req, n) is None:
            return False
        self._take(req, n)
        return True

    def add(self, req: Req) -> bool:
        """Try to admit a waiting request; False means stop adding (budget or memory). A request
        deferred for in-batch prefix sharing is skipped (True: keep trying others)."""
        if self.full:
            return False
        indices, node = self.memory.match(req)
        # hicache: the host tier's part of the prefix is cached too (no prefill), but takes
        # device slots once loaded: charged to the budget like the tokens it spares.
        lower = req.host_hit_len
        prefix = int(indices.numel()) + lower
        extend = req.seq_len - prefix
        if extend > IN_BATCH_CHECK and not self.memory.tree.disable:
            sig = (prefix, tuple(req.all_ids[prefix: prefix + IN_BATCH_CHECK]))
            if sig in self._signatures:
                return True
            self._signatures.add(sig)
        n = min(extend, self.budget)
        # A request that must be chunked can start only if nothing else is chunked.
        need = lower + n + (self._future_tokens(req) if n == extend else 0)
        if need > self.rem_total and (self.reqs or self.memory.available() < need):
            return False
        # hicache: only an admitted request's prefix is loaded (a miss keeps its match)
        if self.memory.tiered and self.memory.needs_load(req):
            indices, node = self.memory.load(req)
            prefix = int(indices.numel())
            n = min(req.seq_len - prefix, self.budget)
        if not self.memory.admit(req, indices, node):
            return False
        if self.memory.reserve_extend(req, n) is None:
            self.memory.release(req)
            return False
        if not req.admitted_once:
            req.cached_tokens = prefix
            req.cached_tokens_details = self.memory.tier_details(req, prefix)  # hicache:
            req.admitted_once = True
        self._take(req, n)
        self.rem_total -= need
        return True

    def _take(self, req: Req, n: int) -> None:
        req.state = ReqState.PREFILLING
        self.reqs.append(req)
        self.budget -= n
        if req.kv_len + n < req.seq_len:
            self.chunked = req
