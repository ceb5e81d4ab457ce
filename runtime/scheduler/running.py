"""RunningBatch: the decode batch, kept between steps instead of rebuilt every step.

It holds the decoding requests in order, their sampling rows (``SamplingBatchInfo``), and the
per-row tensors a decode forward needs, on the device and mirrored on the host: the request
row of ``req_to_token`` and the position of the token fed next (== its KV column). A decode
step advances every position by one with one tensor op; requests leaving or joining ``filter``
and ``merge`` the rows. No per-step Python loop builds tensors and nothing syncs the device.

The token fed to a decode step is never read from the host: it is gathered on the device from
``last_token`` (one entry per request row, written by every sampling step), so the next step
can be launched before the previous step's tokens reached the host (overlap scheduling).
The exception (grammar): a request that took a jump-forward feeds its forced tokens, known on
the host, in its next step (``mixed_batch``: one decode row per token).
"""
from __future__ import annotations

from typing import Any

import torch

from ..layers.attention.shared_prefix import SharedPrefix, build_shared_prefix
from ..model.forward_batch import ForwardBatch, ForwardMode
from .prefix_groups import find_prefix_groups
from ..layers.upload import HostUpload, to_device
from .req import Req

def needs_sync(req: Req) -> bool:
    """Its steps must be read before the next launch: logprobs need that step's logits.
    (A grammar row does not: its step's mask is filled after the forward was queued, once the
    previous step was read; stepping.py ``_decode_mask``.)"""
    return req.return_logprob


def has_grammar(req: Req) -> bool:
    return req.grammar is not None


class RunningBatch:
    def __init__(self, device: torch.device, num_rows: int, tree: Any = None,
                 prefix_members: int | None = None,
                 last_token: torch.Tensor | None = None) -> None:
        """``prefix_members``: requests per shared-prefix tile of the attention backend (None:
        it cannot use shared prefixes); ``tree``: the radix cache the groups come from;
        ``last_token``: the runner's buffer of it (captured step graphs use it), or None."""
        self.device = device
        self.tree = tree
        self.prefix_members = prefix_members
        self._shared: SharedPrefix | None = None
        self._shared_stale = True
        self.reqs: list[Req] = []
        self.info: Any = None  # SamplingBatchInfo, rows aligned with reqs
        self.sync_rows = 0  # requests whose steps must be read before the next launch
        self.grammar_rows = 0  # requests decoding under a grammar (their steps need a mask)
        i64 = dict(dtype=torch.int64)
        self.rows_host = torch.empty(0, **i64)
        self.pos_host = torch.empty(0, **i64)
        self.rows = torch.empty(0, device=device, **i64)
        # tp-step: the device copy of ``pos_host``, uploaded when a step needs it (None: stale;
        # a step of the step graphs uploads positions with its other indices, no add per step)
        self._pos: torch.Tensor | None = None
        # NOTE: last sampled token per request row; rows are reused only after release, and a
        # new owner samples (writes its entry) before its first decode step reads it.
        self.last_token = (torch.zeros(num_rows, device=device, **i64) if last_token is None
                           else last_token)
        self.ones = torch.ones(0, device=device, **i64)
        self.arange = torch.arange(0, device=device, **i64)
        self.upload = HostUpload(device)  # a mixed step's indices (grammar jump-forward)

    def __len__(self) -> int:
        return len(self.reqs)

    def __bool__(self) -> bool:
        return bool(self.reqs)

    # -- composition ------------------------------------------------------------------------
    def filter(self, keep: list[Req]) -> None:
        """Shrink to ``keep`` (a sub-list of ``reqs``, in order)."""
        if len(keep) == len(self.reqs):
            return
        if not keep:
            self._clear()
            return
        pos = {id(r): i for i, r in enumerate(self.reqs)}
        idx = torch.tensor([pos[id(r)] for r in keep], dtype=torch.int64)
        idx_dev = to_device(idx, self.device)
        self.rows_host, self.pos_host = self.rows_host[idx], self.pos_host[idx]
        self.rows, self._pos = self.rows[idx_dev], None
        self.info.filter(idx)
        self.reqs = keep
        self._shared_stale = True
        self.sync_rows = sum(map(needs_sync, keep)) if self.sync_rows else 0
        self.grammar_rows = sum(map(has_grammar, keep)) if self.grammar_rows else 0

    def merge(self, reqs: list[Req], info: Any) -> None:
        """Append requests that just sampled their first token (after a prefill)."""
        rows = torch.tensor([r.req_pool_idx for r in reqs], dtype=torch.int64)
        pos = torch.tensor([r.kv_len for r in reqs], dtype=torch.int64)
        self.rows_host = torch.cat([self.rows_host, rows])
        self.pos_host = torch.cat([self.pos_host, pos])
        self.rows = torch.cat([self.rows, to_device(rows, self.device)])
        self._pos = None
        if self.info is None:
            self.info = info
        else:
            self.info.merge(info)
        self.reqs = self.reqs + reqs
        self._shared_stale = True
        self.sync_rows += sum(map(needs_sync, reqs))
        self.grammar_rows += sum(map(has_grammar, reqs))

    def _clear(self) -> None:
        self.reqs, self.info, self.sync_rows, self.grammar_rows = [], None, 0, 0
        self.rows_host, self.pos_host = self.rows_host[:0], self.pos_host[:0]
        self.rows, self._pos = self.rows[:0], None

    @property
    def pos(self) -> torch.Tensor:
        """Each request's next position on the device (uploaded from ``pos_host`` if stale)."""
        if self._pos is None:
            self._pos = to_device(self.pos_host, self.device)
        return self._pos

    @pos.setter
    def pos(self, value: torch.Tensor) -> None:
        self._pos = value

    # -- one decode step ----------------------------------------------------------------------
    def forward_batch(self, slots: torch.Tensor) -> ForwardBatch:
        """The decode batch feeding each request's last sampled token into ``slots``."""
        bs = len(self.reqs)
        if self.ones.shape[0] < bs:
            self.ones = torch.ones(2 * bs, dtype=torch.int64, device=self.device)
            self.arange = torch.arange(2 * bs, dtype=torch.int64, device=self.device)
        seq_lens = self.pos + 1
        pos_list = self.pos_host.tolist()
        return ForwardBatch(
            mode=ForwardMode.DECODE, batch_size=bs,
            input_ids=self.last_token.index_select(0, self.rows), positions=self.pos,
            req_pool_indices=self.rows, seq_lens=seq_lens, out_cache_loc=slots,
            extend_prefix_lens=self.pos, extend_seq_lens=self.ones[:bs],
            extend_start_loc=self.arange[:bs],
            seq_lens_cpu=[p + 1 for p in pos_list], extend_prefix_lens_cpu=pos_list,
            extend_seq_lens_cpu=[1] * bs, shared_prefix=self.shared_prefix())

    # -- a mixed step (grammar: jump-forward rows) ------------------------------------------
    def forced(self) -> bool:
        """Whether some request's next step feeds jump-forward tokens (``pending_forced``)."""
        return any(r.pending_forced for r in self.reqs)

    def next_tokens(self) -> int:
        """Tokens the next step feeds: one per request, more for jump-forward rows."""
        return len(self.reqs) + sum(r.seq_len - r.kv_len - 1 for r in self.reqs
                                    if r.pending_forced)

    def mixed_batch(self, memory: Any, max_rows: int | None = None
                    ) -> tuple[ForwardBatch, torch.Tensor, list[Req]]:
        """The next step with jump-forward rows: each such request feeds its tokens without
        KV (from the host), every other one its last sampled token (from the device). Every
        fed token is a query row of a decode batch (a request's rows share its table row, with
        increasing lengths: each row attends to the KV up to its own token, all of which is
        stored before any attention), so the step replays a captured decode graph.

        ``max_rows``: the largest batch a graph covers; a request whose tokens do not all fit
        feeds what fits (one at least) and the rest next step. Returns the batch, the rows of
        each request's last fed token (its logits) and the requests not fed in full (their
        token sampled this step must be dropped). Reserves the KV slots and advances the batch.

        NOTE: the requests stay in the batch and its sampling rows (no filter/merge, no trip
        through the queue, the radix cache and an extend the whole batch would wait for)."""
        reqs = self.reqs
        lens, partial = self._fed_lengths(max_rows)
        rows, cols, last, at, ids, pos = self._fed_indices(lens)
        total = len(cols)
        slots = memory.reserve_at(torch.tensor(rows), torch.tensor(cols))
        assert slots is not None, "mixed-step KV reservation failed after retraction"
        self.pos_host = torch.tensor(pos)
        # NOTE: one pinned upload for every index this step needs (each upload of its own
        # took a pinned buffer and a copy launch)
        index = torch.tensor(rows + cols + slots.tolist() + at + ids + last + pos)
        sizes = [total, total, total, len(at), len(ids), len(last), len(pos)]
        rows_d, cols_d, slots_d, at_d, ids_d, last_d, self.pos = self.upload(index).split(sizes)
        memory.write_table(rows_d, cols_d, slots_d)
        input_ids = self.last_token.index_select(0, rows_d)
        input_ids.index_copy_(0, at_d, ids_d)
        if self.ones.shape[0] < total:
            self.ones = torch.ones(2 * total, dtype=torch.int64, device=self.device)
            self.arange = torch.arange(2 * total, dtype=torch.int64, device=self.device)
        batch = ForwardBatch(
            mode=ForwardMode.DECODE, batch_size=total, input_ids=input_ids, positions=cols_d,
            req_pool_indices=rows_d, seq_lens=cols_d + 1, out_cache_loc=slots_d,
            extend_prefix_lens=cols_d, extend_seq_lens=self.ones[:total],
            extend_start_loc=self.arange[:total], seq_lens_cpu=[c + 1 for c in cols],
            extend_prefix_lens_cpu=cols, extend_seq_lens_cpu=[1] * total)
        done = {id(r) for r in partial}
        for req, n in zip(reqs, lens):
            req.kv_len += n
            req.pending_forced = id(req) in done
        return batch, last_d, partial

    def _fed_indices(self, lens: list[int]) -> tuple[list[int], ...]:
        """Per fed token: its request row and column (position); per request: the index of
        its last fed token and its next position; the indices and ids of the host-fed tokens.

        NOTE: Python lists: torch's CPU repeat_interleave took ~1.4 ms per call on the H100
        host (the 16-thread intra-op pool), for a few hundred elements."""
        rows, cols, last, at, ids, pos = [], [], [], [], [], []
        for i, (req, row, n) in enumerate(zip(self.reqs, self.rows_host.tolist(), lens)):
            p = req.kv_len
            if req.pending_forced:
                at.extend(range(len(cols), len(cols) + n))
                fed = p - req.prompt_len  # NOTE: never a prompt token (kv_len >= prompt)
                ids.extend(req.output_ids[fed:fed + n])
                # seeded sampling: the step number of the token sampled next (the token
                # sampled for it in flight, if any, was dropped)
                self.info.steps[i] = len(req.output_ids)
            rows.extend([row] * n)
            cols.extend(range(p, p + n))
            last.append(len(cols) - 1)
            pos.append(p + n)
        return rows, cols, last, at, ids, pos

    def _fed_lengths(self, max_rows: int | None) -> tuple[list[int], list[Req]]:
        """Tokens each request feeds next step, within ``max_rows`` in all (first come first
        served among jump-forward rows), and the requests left with some unfed."""
        room = None if max_rows is None else max(max_rows - len(self.reqs), 0)
        lens, partial = [], []
        for req in self.reqs:
            n = 1
            if req.pending_forced:
                want = req.seq_len - req.kv_len
                n = want if room is None else 1 + min(want - 1, room)
                if room is not None:
                    room -= n - 1
                if n < want:
                    partial.append(req)
            lens.append(n)
        return lens, partial

    def shared_prefix(self) -> SharedPrefix | None:
        """Groups sharing a cached prefix, recomputed only when the batch changed."""
        if self.prefix_members is None or self.tree is None or self.tree.disable:
            return None
        if self._shared_stale:
            self._shared_stale = False
            groups = find_prefix_groups(self.reqs, self.tree.root)
            self._shared = build_shared_prefix(groups, len(self.reqs), self.prefix_members,
                                               self.device) if groups else None
        return self._shared

    def advance(self, device: bool = True) -> None:
        """After a decode launch: every request's next token goes one position further.
        ``device`` False (tp-step: the step graphs upload positions themselves): the device
        copy goes stale instead of taking an add."""
        self._pos = None if self._pos is None or not device else self._pos + 1
        self.pos_host = self.pos_host + 1
        for r in self.reqs:
            r.kv_len += 1

    def after_verify(self, reqs: list[Req]) -> None:
        """spec: after a speculative step (runtime/speculative) appended several tokens per
        request: every request's next position is its ``kv_len`` and its last token the
        newest output token. ``reqs`` is ``self.reqs``."""
        n = len(reqs)  # positions and last tokens in one upload
        host = torch.tensor([r.kv_len for r in reqs] + [r.output_ids[-1] for r in reqs],
                            dtype=torch.int64)
        dev = to_device(host, self.device)
        self.pos_host, self.pos = host[:n], dev[:n]
        self.last_token.index_copy_(0, self.rows, dev[n:])

    def record_tokens(self, rows: torch.Tensor, ids: torch.Tensor) -> None:
        """Sampled ids (device) of the requests in ``rows`` (device): the next decode's inputs."""
        self.last_token.index_copy_(0, rows, ids)
