"""DraftKV: a draft model's own KV bookkeeping, per request id, synced from ``req.all_ids``.

A drafter with a model of its own (STANDALONE, EAGLE heads) keeps, per request, a row of its own
``ReqToTokenPool`` and the ids whose draft KV that row holds (``ids[j]`` fed at position ``j``,
its KV at ``slots[j]``). Each ``propose`` syncs the entry with the request: keep the common
prefix of ``ids`` and ``all_ids`` (free the slots past it: rejected drafts, a jump-forward
rewrite, a retraction that reset the request), then reserve slots for the tokens to feed.
Nothing here knows what was accepted; the ids say it all.

The pools are the draft's own (not the target's radix cache): a finished request's draft KV is
freed, never cached, so the idle invariant is simple: no row held but the padding row, every
slot free.

Row 0 of the draft's table is never a request's: padded CUDA-graph rows (the graph runner's,
on request row 0 at sequence length 1) read its first entry, which stays 0, the pool's dummy
slot. So padded rows read no live request's state (a VLM bug came from padded rows sharing a
live request's row 0).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..cache.pool import ReqToTokenPool, TokenKVPool
from ..layers.upload import to_device


@dataclass
class DraftEntry:
    """One request's draft KV: ``ids[j]`` was fed at position ``j``, its KV is at ``slots[j]``."""

    row: int
    ids: list[int] = field(default_factory=list)
    slots: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two id lists."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # NOTE: the usual case (only appends since the last step), one C compare
        return n
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class DraftKV:
    def __init__(self, req_pool: ReqToTokenPool, kv_pool: TokenKVPool) -> None:
        self.req_pool = req_pool
        self.kv_pool = kv_pool
        self.device = req_pool.req_to_token.device
        self.entries: dict[str, DraftEntry] = {}
        self.pad_row = req_pool.alloc()  # row 0 (see module docstring), held for good
        assert self.pad_row == 0, "DraftKV must take the draft table's first row"

    def sync(self, rid: str, ids: list[int], keep_max: int) -> DraftEntry | None:
        """The entry of ``rid`` truncated to its common prefix with ``ids`` (at most
        ``keep_max`` positions); a new entry (a free row) if it had none; None: no row free."""
        entry = self.entries.get(rid)
        if entry is None:
            row = self.req_pool.alloc()
            if row is None:
                return None
            entry = self.entries[rid] = DraftEntry(row)
        self.truncate(entry, min(common_prefix(entry.ids, ids), keep_max))
        return entry

    def truncate(self, entry: DraftEntry, keep: int) -> None:
        """Forget positions ``keep`` on (their slots go back to the pool)."""
        if keep < len(entry.ids):
            self.kv_pool.free(entry.slots[keep:])
            entry.ids, entry.slots = entry.ids[:keep], entry.slots[:keep]

    def reserve_many(self, wants: list[tuple[DraftEntry, list[int]]]
                     ) -> list[torch.Tensor] | None:
        """Per (entry, ids): slots for feeding ``ids`` after the entry's positions, written into
        its row and recorded as held (the forward that fills them must follow). One allocation
        and one indexed store for all of them (a pinned upload each cost ~20 us of host time
        on the GPU). None: pool exhausted (nothing reserved)."""
        slots = self.kv_pool.alloc(sum(len(ids) for _, ids in wants))
        if slots is None:
            return None
        rows, cols, out, at = [], [], [], 0
        for entry, ids in wants:
            start, n = len(entry.ids), len(ids)
            rows += [entry.row] * n
            cols += range(start, start + n)
            mine = slots[at:at + n]
            at += n
            entry.ids = entry.ids + list(ids)
            entry.slots = torch.cat([entry.slots, mine])
            out.append(mine)
        index = to_device(torch.tensor(rows + cols + slots.tolist(), dtype=torch.int64),
                          self.device).view(3, -1)
        self.req_pool.req_to_token[index[0], index[1]] = index[2]
        return out

    def release(self, rid: str) -> None:
        entry = self.entries.pop(rid, None)
        if entry is not None:
            self.kv_pool.free(entry.slots)
            self.req_pool.free(entry.row)

    def check_idle(self) -> list[str]:
        """Problems when no request runs: held rows or slots, broken free lists."""
        problems = []
        if self.entries:
            problems.append(f"draft KV still held for {len(self.entries)} request(s): "
                            f"{sorted(self.entries)[:5]}")
        if self.kv_pool.available() != self.kv_pool.size:
            problems.append(f"draft KV leak: {self.kv_pool.size - self.kv_pool.available()} "
                            "slot(s) not free")
        if self.req_pool.available() != self.req_pool.size - 1:  # the padding row
            problems.append(f"draft request rows leak: "
                            f"{self.req_pool.size - 1 - self.req_pool.available()} held")
        try:
            self.kv_pool.check_integrity()
            self.req_pool.check_integrity()
        except AssertionError as e:
            problems.append(f"draft pool integrity: {e}")
        return problems
