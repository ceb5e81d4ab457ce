"""SpecDecoder: the speculative decode step the scheduler runs in place of a plain one.

One step: the drafter proposes a tree per request (``Drafter.propose``), constrained requests'
drafts are checked against their grammar (grammar_drafts.py), one target forward verifies every
node (verify_batch.py), the target's samples decide the accepted path per request (accept.py),
and up to ``num_draft_tokens + 1`` tokens are appended per request, each through the same finish
checks as a decode step's (EOS, stop ids/strings/regex, max_new_tokens: the output ends at the
first that fires); the KV of rejected nodes is freed. Requests without a draft ride along as
one-token rows, exactly a decode step for them.

NOTE: the step is read before the next one is launched: the next step's draft depends on this
step's accepted tokens, and the KV columns of the next step on how many were accepted. What
does not wait for the read runs while the device verifies (between the launch of the verify
and its one small read, ``readback.py``): the drafter's next lookups on a guess of the outcome
(``Drafter.prefetch``), the last step's outputs (held when every request decodes on:
``_outputs``, or read by the scheduler after its next launch when that is a plain step), and
the next verify batch for the guessed outcome (prebuild.py; taken only if the guess held).
A step in flight is read first, but only when some request is predicted to
draft from the state known before that read (prediction.py); otherwise, and when speculation
does not pay (more decoding requests than ``speculative_max_batch_size``, or the requests'
expected accepted tokens below what a speculative step costs against a plain one at this batch
size, as measured: cost.py), the scheduler runs its plain, overlapped decode step, so an engine
that cannot speculate runs as a plain one. Per request, a recent acceptance below the larger of
``speculative_min_accept_per_step`` and the cost gate's bar backs off (stats.Backoff): that
request only. Logprobs are computed for accepted tokens (from the verify logits).
"""
from __future__ import annotations

from typing import Any

import torch

from ..layers.upload import to_device
from ..model.forward_batch import ForwardMode
from ..scheduler.inflight import InflightStep
from ..scheduler.stepping import MIN_NEW_TOKEN_RATIO, NEW_TOKEN_RATIO_DECAY
from .accept_step import accept_step
from .base import Drafter, DraftTree, EMPTY_TREE
from .cost import CostGate
from .grammar_drafts import check_draft, draft_limit
from .prebuild import AheadBatch, build_ahead
from .pipeline import may_pipeline, note_guess
from .prediction import expect_drafts
from .readback import VerifyRead
from .registry import build_drafter
from .stats import Backoff, SpecStats
from .verify_batch import VerifyLayout, build_verify
from .verify_graphs import VerifyGraphs
from .verify_sample import sample_verify


class SpecDecoder:
    def __init__(self, config: Any, runner: Any, drafter: Drafter | None = None) -> None:
        self.drafter = drafter if drafter is not None else build_drafter(config, runner)
        self.k = config.speculative_num_draft_tokens
        self.max_batch = config.speculative_max_batch_size
        self.threshold = config.speculative_min_accept_per_step
        self.bar = self.threshold  # this step's: the larger of it and the cost gate's bar
        self.context_len = runner.context_len
        self.stats = SpecStats(self.k)
        # the verify's ids to the host, read after the work done while the device runs; two:
        # a step's and the next one's when that is launched before this one is read
        self.reads = (VerifyRead(), VerifyRead())
        self.pipeline: bool | None = None  # pipeline.py (None: decided at the first step)
        self.guess_rate = 1.0  # recent share of batches built ahead that were taken
        # the last step's outputs: held (``_outputs``), then sent during the next verify
        self.held: list[Any] | None = None
        self.deferred: InflightStep | None = None
        self.ahead: AheadBatch | None = None  # the next step's batch, built ahead
        # tree verifies replay CUDA graphs where captured (after the drafter: an EAGLE
        # drafter installs its hidden-state capture in the target first)
        self.verify_graphs = VerifyGraphs.create(config, runner)
        self.decode_graph_steps = 0  # chain verifies replayed on the target's decode graphs
        # per batch: speculation only while the expected acceptance pays for a speculative
        # step's measured cost against a plain one's (cost.py; a drafter that cannot pay even
        # at full acceptance is probed rarely from the start)
        self.cost = CostGate(config.speculative_min_speedup, draft_tokens=self.k,
                             proposal_cost=self.drafter.proposal_cost())

    # -- the step -------------------------------------------------------------------------
    def launch(self, sched: Any) -> InflightStep | None:
        """Run one speculative step (forward, accept, append, outputs); None: the scheduler
        runs its plain decode step instead (overlapped: the step in flight is read only when
        some request is predicted to draft, prediction.py). A batch built ahead during the
        last verify (prebuild.py) is taken if it is this step's, else freed."""
        ahead, self.ahead = self.ahead, None
        try:
            return self._launch(sched, ahead)
        finally:
            if ahead is not None and not ahead.taken:
                self._drop(ahead)

    def _drop(self, ahead: AheadBatch) -> None:
        """A batch built ahead that its step did not take: its slots go back (a launched
        one's forward ran for nothing); the guesses' hit rate falls (pipeline.py)."""
        self.stats.ahead_wasted += ahead.read is not None
        note_guess(self, False)
        ahead.taken = True  # (freed)
        ahead.free()

    def _launch(self, sched: Any, ahead: AheadBatch | None) -> InflightStep | None:
        running = sched.running
        forwards = sched.counters["forward_steps"]
        self.cost.tick(forwards)
        self.deferred = None
        if len(running) > self.max_batch or not self._gate(running.reqs):
            self.stats.skipped_steps += 1
            return self._plain(sched, forwards)
        pending = sched.pending
        # a speculative step's outputs only (its tokens are in): sent while the device verifies
        self.deferred = pending if pending is not None and pending.spec_outputs else None
        if pending is not None and self.deferred is None:
            if not expect_drafts(self, sched, running.reqs, pending):
                self.stats.predicted_empty += 1
                return self._plain(sched, forwards)
            sched._read(pending)
        if not running:
            return None
        reqs = list(running.reqs)
        trees, masks, ends = self._drafts(sched, reqs)
        # jump-forward tokens without KV (``pending_forced``) are fed ahead of the root
        total = sum(r.seq_len - r.kv_len for r in reqs) + sum(map(len, trees))
        emitted = self.stats.emitted_tokens
        if ahead is not None and any(trees) and ahead.matches(reqs, trees):
            ahead.taken = True  # its slots are this step's
            self.stats.ahead_taken += 1
            note_guess(self, True)
            total = 0
        elif ahead is not None:
            self._drop(ahead)
            ahead = None
        if not any(trees) or sched.memory.available() < total or not self._verify(
                sched, reqs, trees, masks, ends, ahead):
            self.stats.empty_proposals += 1  # a plain step after all (read synchronously)
            # NOTE: for the gate, a plain step launched with nothing in flight (a refill: its
            # interval holds no device time of its own; the next speculative one is not steady)
            self.cost.launched(False, len(reqs), len(reqs), forwards, refill=True)
            return None
        self.cost.launched(True, self.stats.emitted_tokens - emitted, len(reqs), forwards)
        sched.ratio = max(sched.ratio - NEW_TOKEN_RATIO_DECAY, MIN_NEW_TOKEN_RATIO)  # as decode
        return self._outputs(reqs)

    def _outputs(self, reqs: list[Any]) -> InflightStep:
        """The step, for the scheduler to read: its outputs are sent then (after the next
        launch, or during the next verify's device time, ``_verify``) when ``_after_tokens``
        held them back; else an empty step (sent already)."""
        held, self.held = self.held, None
        if held is None:
            return InflightStep.launched(ForwardMode.DECODE, [], True)
        step = InflightStep.launched(ForwardMode.DECODE, held, False)
        step.spec_outputs = True
        return step

    def _plain(self, sched: Any, forwards: int) -> None:
        """The scheduler's plain decode step runs: it counts toward each backoff's wait."""
        running = sched.running
        for req in running.reqs:
            if req.spec_backoff is not None:
                req.spec_backoff.skip()
        pending = sched.pending  # a speculative step's outputs: nothing on the device
        self.cost.launched(False, len(running), len(running), forwards,
                           refill=pending is None or pending.spec_outputs)
        return None

    def _verify(self, sched: Any, reqs: list[Any], trees: list[DraftTree],
                masks: list[Any], ends: list[bool], ahead: AheadBatch | None) -> bool:
        """The verify forward over every request's tree, the samples, the accepted tokens.
        False: KV ran short (cannot happen after launch's check; a plain step if it does).
        ``ahead``: this step's batch, built (and maybe launched) during the last verify."""
        if ahead is not None and ahead.read is not None:  # already on the device
            batch, layout, logits, read = ahead.batch, ahead.layout, ahead.logits, ahead.read
            self.stats.pipelined_steps += 1
        else:
            built = (ahead.batch, ahead.layout) if ahead is not None else build_verify(
                reqs, trees, sched.memory, sched.device)
            if built is None:
                return False
            batch, layout = built
            read = self.reads[0]
            logits = self._launch_verify(sched, reqs, trees, batch, layout, masks, read)
        # the device verifies meanwhile: the drafter's next lookups (on a guess of what this
        # step accepts; ngram.py), the last step's outputs, the next batch for that guess
        # (prebuild.py), launched at once where it may be (pipeline.py)
        self.drafter.prefetch(reqs, trees)
        if self.deferred is not None:
            sched._read(self.deferred)
            self.deferred = None
        if all(m is None for m in masks):
            self.ahead = nxt = build_ahead(self, sched, reqs, trees, layout)
            self.stats.ahead_built += nxt is not None
            if nxt is not None and may_pipeline(self, sched):
                nxt.read = self.reads[1] if read is self.reads[0] else self.reads[0]
                nxt.logits = self._launch_verify(sched, reqs, nxt.trees, nxt.batch,
                                                 nxt.layout, [None] * len(reqs), nxt.read)
        ids = read.wait()
        self.stats.verify_steps += 1
        self.stats.tree_steps += batch.mode is ForwardMode.TARGET_VERIFY
        accept_step(self, sched, reqs, trees, layout, logits, ids, ends)
        return True

    def _launch_verify(self, sched: Any, reqs: list[Any], trees: list[DraftTree], batch: Any,
                       layout: VerifyLayout, masks: list[Any], read: VerifyRead
                       ) -> torch.Tensor:
        """Queue the verify forward and its samples, and their copy to the host (``read``)."""
        logits = self._forward(sched.runner, batch)
        verify = logits if not layout.fed_extra else logits.index_select(
            0, to_device(torch.tensor(layout.verify_rows), logits.device))
        read.start(sample_verify(sched, reqs, trees, verify, masks))
        return logits

    def _forward(self, runner: Any, batch: Any) -> torch.Tensor:
        """The verify forward: chains on the decode graphs (``runner.forward``), trees on the
        verify graphs when they fit, else eagerly."""
        graphs = self.verify_graphs
        if graphs is not None and graphs.can_run(batch):
            return graphs.run(batch)
        # NOTE: counted apart from the tree replays (``spec_verify_graph_steps``): a chain
        # verify replays the decode graphs even with ``speculative_disable_cuda_graph``
        decode = getattr(runner, "cuda_graph_runner", None)
        self.decode_graph_steps += decode is not None and decode.can_run(batch)
        return runner.forward(batch)

    def _gate(self, reqs: list[Any]) -> bool:
        """Whether this step speculates: some request may draft, and the tokens they are
        expected to accept pay for a speculative step at this batch size (cost.py). A request
        whose recent acceptance is below what a verify needs to pay backs off (its own wait,
        then a probe), so a losing phase of one request keeps no other one plain."""
        bar = self.cost.accept_bar(len(reqs))
        self.bar = max(self.threshold, bar)
        drafting = [r for r in reqs if self._may_draft(r, self.bar)]
        if not drafting:
            return False
        # NOTE: a request without history is expected to accept every draft: its first
        # verify measures it (one step's cost)
        gain = sum(r.spec_backoff.avg if r.spec_backoff is not None else self.k
                   for r in drafting)
        return self.cost.allow(len(reqs), 1 + gain / len(reqs))

    def _may_draft(self, req: Any, bar: float | None = None) -> bool:
        backoff = req.spec_backoff
        if backoff is not None and bar is not None:
            backoff.hold(bar)  # the bar rose above its average: it backs off now
        return req.remaining_tokens > 1 and (backoff is None or backoff.wait == 0)

    def _drafts(self, sched: Any, reqs: list[Any]
                ) -> tuple[list[DraftTree], list[Any], list[bool]]:
        """A (possibly empty) tree per request and, for constrained ones, its mask rows and
        whether its last token hands the next step to the grammar (grammar_drafts.py)."""
        limits = [self._limit(r) for r in reqs]
        asking = [i for i, n in enumerate(limits) if n > 0]
        proposed = self.drafter.propose([reqs[i] for i in asking], self.k) if asking else []
        trees = [EMPTY_TREE] * len(reqs)
        for i, tree in zip(asking, proposed):
            trees[i] = tree.prefix(min(len(tree), limits[i]))
            if not tree:  # NOTE: nothing to draft counts as nothing accepted: a request
                self._observe(reqs[i], 0)  # that never drafts stops costing the overlap
        masks: list[Any] = [None] * len(reqs)
        ends = [False] * len(reqs)  # the draft's last token hands the next step to the grammar
        manager = sched.grammar
        if manager is not None:
            jump = manager.jump_forward and (manager.jump_max_batch is None
                                             or len(reqs) <= manager.jump_max_batch)
            for i, req in enumerate(reqs):
                if req.grammar is not None:
                    limit = draft_limit(req, manager, len(trees[i]))
                    trees[i], masks[i], ends[i] = check_draft(req, trees[i], manager, jump,
                                                              limit)
        return trees, masks, ends

    def _limit(self, req: Any) -> int:
        """Draft tokens this request may take now: 0 while backing off; never past its
        max_new_tokens (the bonus token counts) nor its context."""
        backoff = req.spec_backoff
        if backoff is not None and backoff.skip():
            return 0
        room = min(req.remaining_tokens - 1, self.context_len - req.seq_len - 1)
        return max(min(self.k, room), 0)

    def _observe(self, req: Any, accepted: int) -> None:
        req.spec_backoff = req.spec_backoff or Backoff(avg=max(1.0, self.bar))
        req.spec_backoff.update(accepted, self.bar)

    # -- requests leaving, integrity, statistics ------------------------------------------------
    def release(self, req: Any) -> None:
        self.drafter.release(req.rid)
        req.spec_backoff = None
        if self.ahead is not None and self.ahead.holds(req):  # its rows cannot be taken
            self.ahead.free()
            self.ahead = None

    def check_idle(self) -> list[str]:
        held = ["a verify batch built ahead still holds KV"] if self.ahead is not None else []
        return self.drafter.check_idle() + held

    def stats_dict(self) -> dict:
        graphs = self.verify_graphs
        return {**self.stats.as_dict(), **self.cost.as_dict(),
                "spec_verify_graph_steps": graphs.replays if graphs is not None else 0,
                "spec_verify_decode_graph_steps": self.decode_graph_steps,
                "spec_draft_graph_steps": getattr(self.drafter, "graph_steps", 0),
                "spec_draft_prefetch_hits": getattr(self.drafter, "prefetch_hits", 0)}
