"""EAGLE / EAGLE3 drafting: a one-layer draft head over the target's hidden states drafts a
token tree with top-k expansion (``speculative_eagle_topk`` children per frontier node,
``speculative_num_steps`` levels, the ``speculative_num_draft_tokens`` best nodes proposed).

Position ``j`` of the head's KV is computed from (the target's hidden state at ``j``, token
``j + 1``), so the head's KV of a request covers positions ``0 .. n - 2`` of its ``n`` verified
ids, and the output at ``n - 2`` scores the first draft level. The target's states come from
``HiddenCapture`` (installed on the target model, read by KV slot through the target's request
table), so ``propose``'s ``hidden`` argument is not needed. Per ``propose``: sync the head's KV
with ``all_ids`` (``DraftKV``, keyed by the fed tokens ``all_ids[1:]``), feed the missing
positions in one forward, then one decode forward per level over the frontier. Each frontier
node decodes in a branch row of the head's request table (a copy of its parent's row plus its
own slot), so the runtime's attention backends serve the tree unchanged. Tree KV is computed
from the head's own states, not the target's, so it is freed after each ``propose``.
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

import torch

from ..cache.pool import ReqToTokenPool, TokenKVPool
from ..config import EngineConfig
from ..layers.attention.registry import create_attention_backend, resolve_backend_name
from ..layers.linear import local_heads
from ..layers.upload import to_device
from ..model.runner import EXTRA_REQ_ROWS
from .base import EMPTY_TREE, ROOT, DraftTree, Drafter
from .draft_batch import Feed, build_batch, last_rows
from .draft_kv import DraftKV
from .eagle_graphs import HeadGraphs
from .eagle_head_loader import head_capture_points, load_head
from .eagle_tree import TreeCandidates
from .hidden_capture import HiddenCapture
from .standalone import resolve_draft_dir

logger = logging.getLogger(__name__)


class EagleDrafter(Drafter):
    needs_hidden_states = True

    def __init__(self, config: EngineConfig, runner: Any) -> None:
        self.target = runner
        self.device = runner.device
        self.dtype = runner.dtype
        self.steps = config.speculative_num_steps
        self.topk = config.speculative_eagle_topk
        self.num_tokens = config.speculative_num_draft_tokens
        self.context_len = runner.context_len
        eagle3 = config.speculative_algorithm == "EAGLE3"
        head_dir = resolve_draft_dir(config)
        self.head, self.model_config, raw = load_head(head_dir, eagle3, runner, config)
        self.embed = runner.model.model.embed_tokens  # the target's (EAGLE shares it)
        # a head row per request, and topk branch rows per request of a speculative step
        # (at most speculative_max_batch_size of them: the table is context_len wide)
        main = config.max_running_requests + EXTRA_REQ_ROWS
        # (+ 1: row 0, padded graph rows', DraftKV's)
        rows = 1 + main + min(main, config.speculative_max_batch_size + EXTRA_REQ_ROWS) * self.topk
        self.req_to_token_pool = ReqToTokenPool(rows, self.context_len, self.device)
        mc = self.model_config
        slots = runner.max_total_tokens + rows * self.steps
        # TP: the head's layer is sharded like the target's (its q/k/v and MLP split over the
        # ranks, one all-reduce each after o_proj and down_proj); each rank keeps its kv heads
        self.num_local_heads, kv_heads = local_heads(mc.num_heads, mc.num_kv_heads,
                                                     getattr(runner, "tp_size", 1))
        self.token_kv_pool = TokenKVPool(slots, 1, kv_heads, mc.head_dim, runner.dtype,
                                         self.device)
        self.attn = create_attention_backend(
            resolve_backend_name(config.attention_backend, self.device), self)
        self.kv = DraftKV(self.req_to_token_pool, self.token_kv_pool)
        points = head_capture_points(raw, eagle3, runner.model_config.num_layers)
        # EAGLE3: the head's fc (3 target layers -> its hidden size) applied as states are kept
        project = self.head.fc if eagle3 else None
        width = mc.hidden_size if eagle3 else runner.model_config.hidden_size
        self.capture = HiddenCapture(points, width, runner.max_total_tokens, runner.dtype,
                                     self.device, project)
        self.capture.install(runner)
        # the head's decode-row steps replay CUDA graphs where the target's decode does
        self.graphs = HeadGraphs.create(config, self, runner)
        self.graph_steps = 0  # draft forwards run as a graph replay (spec_draft_graph_steps)
        logger.info("%s head %s: capture %s, topk %d, steps %d, %d tokens",
                    config.speculative_algorithm, head_dir, points, self.topk, self.steps,
                    self.num_tokens)

    # -- propose ---------------------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, reqs: Sequence[Any], max_tokens: int,
                hidden: Any = None) -> list[DraftTree]:
        n_tokens = min(max_tokens, self.num_tokens)
        trees = [EMPTY_TREE] * len(reqs)
        if n_tokens <= 0:
            return trees
        live, feeds, target_slots = self._sync_all(reqs)
        if not feeds:
            return trees
        branch_rows = [self.req_to_token_pool.alloc() for _ in range(len(feeds) * self.topk)]
        tree_slots: list[torch.Tensor] = []
        try:
            cands = self._draft(feeds, torch.cat(target_slots), branch_rows, tree_slots)
        finally:  # NOTE: tree KV came from the head's own states: never kept
            for slots in tree_slots:
                self.token_kv_pool.free(slots)
            for row in branch_rows:
                self.req_to_token_pool.free(row)
        for i, c in zip(live, cands):
            trees[i] = c.tree(n_tokens)
        return trees

    def _sync_all(self, reqs: Sequence[Any]) -> tuple[list[int], list[Feed], list[torch.Tensor]]:
        """Per request with room: its feed (positions without head KV) and the target KV
        slots of those positions (whose hidden states the feed reads)."""
        live: list[int] = []
        wants: list[tuple[Any, list[int]]] = []
        target_slots: list[torch.Tensor] = []
        budget = self.token_kv_pool.available()
        rows_free = self.req_to_token_pool.available()
        target_table = self.target.req_to_token_pool.req_to_token
        for i, req in enumerate(reqs):
            ids, n = req.all_ids, len(req.all_ids)
            if n < 2 or n - 2 + self.steps > self.context_len or req.req_pool_idx is None:
                self.release(req.rid)
                continue
            entry = self.kv.sync(req.rid, ids[1:], n - 2)
            if entry is None:
                continue
            keep = len(entry.ids)
            need = (n - 1 - keep) + (self.steps - 1) * self.topk
            if need > budget or rows_free < self.topk:
                continue
            budget -= need
            rows_free -= self.topk
            wants.append((entry, ids[keep + 1:n]))
            target_slots.append(target_table[req.req_pool_idx, keep:n - 1])
            live.append(i)
        starts = [len(entry.ids) for entry, _ in wants]
        slots = self.kv.reserve_many(wants) if wants else []
        assert slots is not None  # within the budget just counted
        feeds = [Feed(e.row, s, ids, sl) for (e, ids), s, sl in zip(wants, starts, slots)]
        return live, feeds, target_slots

    def _draft(self, feeds: list[Feed], target_slots: torch.Tensor, branch_rows: list[int],
               tree_slots: list[torch.Tensor]) -> list[TreeCandidates]:
        """Every level's candidates. ``expanding``: per request, (node, forward row whose
        output scores the node's children); ``table_rows``: each forward row's table row."""
        top, state = self._first(feeds, target_slots)
        cands = [TreeCandidates() for _ in feeds]
        expanding = [[(ROOT, b)] for b in range(len(feeds))]
        table_rows = [f.row for f in feeds]
        for level in range(1, self.steps + 1):
            nodes = self._expand(cands, expanding, top)
            if level == self.steps:
                break
            top, state = self._level(feeds, cands, nodes, state, table_rows, branch_rows,
                                     level, tree_slots)
            table_rows = branch_rows
            k = self.topk
            expanding = [[(node, b * k + j) for j, (node, _) in enumerate(items)]
                         for b, items in enumerate(nodes)]
        return cands

    def _first(self, feeds: list[Feed], target_slots: torch.Tensor
               ) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        """The feeds' forward: the first level's top-k and the head's state, one row per
        request (its last fed position)."""
        batch = build_batch(feeds, self.device)
        rows = None
        if batch.num_tokens > len(feeds):  # every fed token's row
            rows = to_device(torch.tensor(last_rows(feeds), dtype=torch.int64), self.device)
        vals, idx, state = self._forward(batch, self.capture.read(target_slots), rows)
        return (vals, idx), state

    def _expand(self, cands: list[TreeCandidates], expanding: list[list[tuple[int, int]]],
                top: tuple[torch.Tensor, torch.Tensor]) -> list[list[tuple[int, int]]]:
        """Children of every expanding node; per request the ``topk`` best of them, each with
        the forward row it came from (its state and table row feed it next)."""
        vals, idx = top[0].tolist(), top[1].tolist()
        out = []
        for b, items in enumerate(expanding):
            children: list[tuple[int, int]] = []
            for node, row in items:
                children += [(c, row) for c in cands[b].expand(node, idx[row], vals[row])]
            origin = dict(children)
            out.append([(c, origin[c]) for c in cands[b].best(list(origin), self.topk)])
        return out

    def _level(self, feeds: list[Feed], cands: list[TreeCandidates],
               nodes: list[list[tuple[int, int]]], state: torch.Tensor, table_rows: list[int],
               branch_rows: list[int], level: int, tree_slots: list[torch.Tensor]
               ) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        """Decode the depth-``level`` nodes at position ``n - 2 + level``, node ``j`` of
        request ``b`` in branch row ``b * topk + j``: a copy of the table row its parent was
        decoded in, plus its own new slot."""
        k = self.topk
        slots = self.token_kv_pool.alloc(len(feeds) * k)
        assert slots is not None  # counted in _sync_all's budget
        tree_slots.append(slots)
        step_feeds, origins = [], []
        for b, (feed, items) in enumerate(zip(feeds, nodes)):
            pos = feed.start + len(feed.ids) - 1 + level
            for j, (node, origin) in enumerate(items):
                r = b * k + j
                step_feeds.append(Feed(branch_rows[r], pos, [cands[b].tokens[node]],
                                       slots[r:r + 1]))
                origins.append(origin)
        dev = self.device
        index = torch.tensor(origins + [table_rows[o] for o in origins]
                             + [f.row for f in step_feeds] + [f.start for f in step_feeds])
        origin_d, src_d, dst_d, pos_d = to_device(index, dev).split(len(origins))
        table = self.req_to_token_pool.req_to_token
        table.index_copy_(0, dst_d, table.index_select(0, src_d))
        table[dst_d, pos_d] = to_device(slots[:len(origins)], dev)
        vals, idx, new_state = self._forward(build_batch(step_feeds, dev),
                                             state.index_select(0, origin_d))
        return (vals, idx), new_state

    def _forward(self, batch: Any, hidden: torch.Tensor, rows: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``step`` over ``batch``, as a graph replay when one fits; ``rows``: keep only
        those rows of the output."""
        graphs = self.graphs
        if graphs is None or not graphs.fits(batch):
            return self.step(batch, hidden, rows)
        self.graph_steps += 1
        out = graphs.run(batch, hidden)
        return out if rows is None else tuple(t.index_select(0, rows) for t in out)

    def step(self, batch: Any, hidden: torch.Tensor, rows: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One head forward: per row (of ``rows``) the ``topk`` best log-probs, their target
        ids and the head's next hidden state (what the head graphs capture)."""
        self.attn.init_forward_metadata(batch)
        out, state = self.head(batch, self.attn, self.embed(batch.input_ids), hidden)
        if rows is not None:
            out, state = out.index_select(0, rows), state.index_select(0, rows)
        logits = self.head.draft_logits(out)
        if logits is None:  # EAGLE: the target's lm_head
            logits = self.target.model.compute_logits(out)
        vals, idx = torch.log_softmax(logits, dim=-1).topk(self.topk, dim=-1)
        if self.head.lm_head is not None:  # EAGLE3: draft vocabulary -> target ids
            idx = idx + self.head.d2t[idx]
        return vals, idx, state

    # -- leaving, integrity ------------------------------------------------------------------
    def release(self, rid: str) -> None:
        self.kv.release(rid)

    def check_idle(self) -> list[str]:
        return self.kv.check_idle()
