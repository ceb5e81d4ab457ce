"""KVMemory: the scheduler's view of KV resources: the request->token table, the token pool and
the radix prefix cache (a disabled tree when ``disable_radix_cache``). It moves slot ownership between
requests and the tree; the scheduler never touches the pools directly.

On a GPU the request->token table lives on the device (kernels read it); the scheduler keeps a
host mirror and reads only that, and writes both without blocking, so no bookkeeping step waits
for the forward in flight (overlap scheduling).
"""
from __future__ import annotations

from typing import Any

import torch

from ..layers.upload import to_device
from .req import Req
from .running import RunningBatch


class KVMemory:
    def __init__(self, req_to_token_pool: Any, token_kv_pool: Any, tree: Any) -> None:
        self.req_pool = req_to_token_pool
        self.kv_pool = token_kv_pool
        self.tree = tree
        table = req_to_token_pool.req_to_token
        self.device = table.device
        # NOTE: the host mirror is the device table itself on the CPU (one table, no copies).
        self.host_table = table if table.device.type == "cpu" else torch.zeros(
            table.shape, dtype=table.dtype)

    def _write(self, row: int, start: int, slots: torch.Tensor) -> None:
        """``table[row, start:start+n] = slots`` on the host mirror and the device."""
        end = start + int(slots.numel())
        self.host_table[row, start:end] = slots
        if self.host_table is not self.req_pool.req_to_token:
            self.req_pool.req_to_token[row, start:end] = to_device(slots, self.device)

    # -- capacity -------------------------------------------------------------------------
    @property
    def total_slots(self) -> int:
        return self.kv_pool.size

    def evictable(self) -> int:
        return self.tree.evictable_size()

    def available(self) -> int:
        """Slots obtainable now: free ones plus unlocked cached ones."""
        return self.kv_pool.available() + self.tree.evictable_size()

    def alloc_slots(self, n: int) -> torch.Tensor | None:
        if n > self.kv_pool.available():
            self.tree.evict(n - self.kv_pool.available())
        return self.kv_pool.alloc(n)

    # -- prefix matching --------------------------------------------------------------------
    def match(self, req: Req) -> tuple[torch.Tensor, Any]:
        """Cached prefix of the request in device memory (KV slots, tree node), capped at
        ``max_prefix_len``. hicache: ``req.host_hit_len`` is set to the tokens after it that
        the host tier holds (``load`` brings them back once the request is admitted)."""
        node = self._rematch(req)
        if node is not None:
            return self.tree.path_slots(node), node
        result = self.tree.match_prefix(req.prefix_ids(req.max_prefix_len))
        req.host_hit_len = getattr(result, "host_length", 0)  # hicache:
        req.match_memo = (req.epoch, req.max_prefix_len, result.node)
        return result.slots, result.node

    def match_len(self, req: Req) -> int:
        """``match``'s prefix length alone (LPM's order): O(depth) while the request's last
        match still holds (no copy of the prompt, no slots gathered)."""
        node = self._rematch(req)
        return node.prefix_len if node is not None else int(self.match(req)[0].numel())

    def _rematch(self, req: Req) -> Any:
        """The node of the request's last match if a match now would end there (radix
        ``rematch``), else None. hicache: a tiered tree always matches afresh."""
        memo, length = req.match_memo, req.max_prefix_len
        if memo is None or memo[0] != req.epoch or memo[1] != length or self.tiered:
            return None
        if self.tree.rematch(memo[2], req.origin_input_ids if length <= req.prompt_len
                             else req.all_ids, length) is None:
            return None
        req.host_hit_len = 0
        return memo[2]

    @property
    def tiered(self) -> bool:
        """hicache: the tree spans host/storage tiers (admission goes through ``load``)."""
        return getattr(self.tree, "tiered", False)

    def needs_load(self, req: Req) -> bool:
        """hicache: admission must go through ``load`` (the last ``match`` ended in host
        tokens, ...: ``HiRadixCache.load_needed``); otherwise that match is final (a miss: no
        second walk, nothing loaded)."""
        return self.tree.load_needed(req.host_hit_len)

    def load(self, req: Req) -> tuple[torch.Tensor, Any]:
        """hicache: ``match``, with the host- and storage-resident part of the prefix loaded
        onto the device first (copies queued ahead of the prefill's attention, per layer)."""
        result, host, storage = self.tree.match_and_load(req.all_ids[: req.max_prefix_len])
        req.hicache_loaded[0] += host
        req.hicache_loaded[1] += storage
        req.host_hit_len = 0
        return result.slots, result.node

    def tier_details(self, req: Req, prefix: int) -> dict[str, int] | None:
        """hicache: the cached prefix split by tier (None without the hierarchical cache)."""
        if not getattr(self.tree, "tiered", False):
            return None
        return self.tree.admitted(prefix, req.hicache_loaded)

    def issue_backups(self) -> None:
        """hicache: start the write-through copies queued since the last call (one batch),
        once a step was launched and the previous one read: off the path to the next launch."""
        end_step = getattr(self.tree, "end_step", None)
        if end_step is not None:
            end_step()

    # -- admission ------------------------------------------------------------------------
    def admit(self, req: Req, indices: torch.Tensor, node: Any) -> bool:
        """Give the request a table row and lock its cached prefix. False if no row is free."""
        row = self.req_pool.alloc()
        if row is None:
            return False
        self.tree.lock(node)
        req.req_pool_idx, req.prefix_indices, req.last_node = row, indices, node
        n = int(indices.numel())
        if n:
            self._write(row, 0, indices)
        req.kv_len = n
        return True

    def reserve_extend(self, req: Req, n: int) -> torch.Tensor | None:
        """KV slots for the next ``n`` tokens of an admitted request, written into its row."""
        slots = self.alloc_slots(n)
        if slots is None:
            return None
        self._write(req.req_pool_idx, req.kv_len, slots)
        req.extend_len, req.extend_slots = n, slots
        return slots

    def reserve_decode(self, batch: RunningBatch, device_table: bool = True
                       ) -> torch.Tensor | None:
        """One KV slot per decoding request (for its last sampled token, at column ``pos``),
        in one allocation, written with two indexed stores (no per-request loop).
        ``device_table`` False (tp-step): host slots, the device table left to the caller
        (the step graphs write it from the indices they upload anyway)."""
        slots = self.alloc_slots(len(batch))
        if slots is None:
            return None
        self.host_table[batch.rows_host, batch.pos_host] = slots
        if self.host_table is self.req_pool.req_to_token or not device_table:
            return slots
        slots_dev = to_device(slots, self.device)
        self.req_pool.req_to_token[batch.rows, batch.pos] = slots_dev
        return slots_dev

    def reserve_at(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor | None:
        """One KV slot per (request row, column) pair (host tensors): a mixed step's tokens
        (grammar jump-forward rows feed several). Written into the host table; the caller
        uploads the slots and writes the device table (``write_table``). Host slots."""
        slots = self.alloc_slots(int(rows.numel()))
        if slots is not None:
            self.host_table[rows, cols] = slots
        return slots

    def write_table(self, rows: torch.Tensor, cols: torch.Tensor, slots: torch.Tensor) -> None:
        """The device table's side of ``reserve_at`` (device tensors; nothing on the CPU)."""
        if self.host_table is not self.req_pool.req_to_token:
            self.req_pool.req_to_token[rows, cols] = slots

    # -- release ----------------------------------------------------------------------------
    def cache_chunk(self, req: Req) -> None:
        """After a non-final prefill chunk: hand the computed tokens to the tree and keep the
        request locked on the new, longer prefix (so eviction cannot take its own KV)."""
        row, old = req.req_pool_idx, req.prefix_len
        kv = self.host_table[row, : req.kv_len].clone()
        slots, node = self.tree.cache_unfinished_req(req.all_ids[: req.kv_len], kv, req.last_node)
        # NOTE: duplicates of tokens another request cached meanwhile were replaced by the tree's.
        if not torch.equal(slots[old:], kv[old:]):
            self._write(row, old, slots[old:])
        req.prefix_indices, req.last_node = slots, node

    def release(self, req: Req) -> None:
        """Finished, aborted or retracted: computed KV goes to the tree (or is freed), the row
        is returned and the prefix unlocked. The request forgets its KV state."""
        if req.req_pool_idx is None:
            return
        if req.jump_kv_valid:  # grammar: a token replaced after an overlapped step computed it
            self.truncate(req, req.jump_kv_valid)
            req.jump_kv_valid = 0
        row, kv_len = req.req_pool_idx, req.kv_len
        kv = self.host_table[row, :kv_len].clone()
        self.tree.cache_finished_req(req.all_ids[:kv_len], kv, req.last_node)
        if req.extend_len:  # slots reserved for a forward that never ran: no KV in them
            self.kv_pool.free(req.extend_slots)
        self.req_pool.free(row)
        req.reset_kv_state()

    def truncate(self, req: Req, kv_len: int) -> None:
        """Drop the KV of positions ``kv_len`` on (decode slots not yet in the tree), e.g. a
        token replaced by jump-forward after an overlapped step computed its KV."""
        if req.req_pool_idx is None or kv_len >= req.kv_len:
            return
        assert kv_len >= req.prefix_len, "cannot truncate into the cached prefix"
        self.kv_pool.free(self.host_table[req.req_pool_idx, kv_len:req.kv_len].clone())
        req.kv_len = kv_len

    # -- maintenance ----------------------------------------------------------------------------
    def flush(self) -> bool:
        return self.tree.reset()

    def check_idle(self) -> None:
        """Idle invariant: every slot is free or evictable, nothing locked, every row free."""
        self.kv_pool.check_integrity()
        self.req_pool.check_integrity()
        assert self.req_pool.available() == self.req_pool.size, (
            f"{self.req_pool.size - self.req_pool.available()} request rows still held")
        self.tree.check_integrity(idle=True)  # hicache: the tiered tree checks its host pool too
        total = self.kv_pool.available() + self.evictable()
        assert total == self.total_slots, (
            f"KV leak: free {self.kv_pool.available()} + evictable {self.evictable()} "
            f"!= total {self.total_slots}")
