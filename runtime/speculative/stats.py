"""Speculation statistics: engine counters (``spec_*`` in ``stats()``, exported by /metrics)
and the per-request acceptance that drives the adaptive backoff."""
from __future__ import annotations

from dataclasses import dataclass


class SpecStats:
    """Counters over all verify steps and a histogram of accepted draft tokens per request
    per verify step (a ``grammar.compile.admission.Histogram``-style snapshot)."""

    def __init__(self, max_draft: int) -> None:
        self.bounds = list(range(max_draft + 1))
        self.counts = [0] * (max_draft + 2)  # per accepted length, the last: above max
        self.verify_steps = 0  # verify forwards
        self.tree_steps = 0  # of those, tree-masked extends (some draft branched)
        self.verify_rows = 0  # request rows verified (with or without a draft)
        self.draft_tokens = 0
        self.accepted_tokens = 0
        self.emitted_tokens = 0
        self.skipped_steps = 0  # plain decode steps decided up front (batch too large...)
        self.empty_proposals = 0  # plain steps after a proposal drafted nothing (or no KV)
        self.predicted_empty = 0  # plain overlapped steps: no draft predicted (prediction.py)
        self.step_ends = 0  # accepted drafts ending where the grammar steps in (jump, stop)
        self.forced_between = 0  # forced completions measured between draft tokens (append.py)
        self.held_outputs = 0  # steps whose outputs went out during the next one (decoder.py)
        self.ahead_built = 0  # verify batches built ahead for a guessed outcome (prebuild.py)
        self.ahead_taken = 0  # of them, taken by their step
        self.pipelined_steps = 0  # taken already launched: verified before the last was read
        self.ahead_wasted = 0  # launched ahead for a guess that failed (a forward for nothing)

    def observe(self, drafted: int, accepted: int, emitted: int) -> None:
        self.verify_rows += 1
        self.draft_tokens += drafted
        self.accepted_tokens += accepted
        self.emitted_tokens += emitted
        if drafted:
            self.counts[min(accepted, len(self.bounds))] += 1

    def snapshot(self) -> dict:
        cumulative, total = [], 0
        for n in self.counts[:-1]:
            total += n
            cumulative.append(total)
        count = total + self.counts[-1]
        return {"le": self.bounds, "cumulative": cumulative, "count": count,
                "sum": sum(i * n for i, n in enumerate(self.counts))}

    def as_dict(self) -> dict:
        rows = self.verify_rows
        return {"spec_verify_steps": self.verify_steps, "spec_tree_steps": self.tree_steps,
                "spec_verify_rows": rows,
                "spec_draft_tokens": self.draft_tokens,
                "spec_accepted_tokens": self.accepted_tokens,
                "spec_emitted_tokens": self.emitted_tokens,
                "spec_skipped_steps": self.skipped_steps,
                "spec_empty_proposals": self.empty_proposals,
                "spec_predicted_empty": self.predicted_empty,
                "spec_forced_between_drafts": self.forced_between,
                "spec_grammar_step_ends": self.step_ends,
                "spec_outputs_held": self.held_outputs,
                "spec_ahead_built": self.ahead_built, "spec_ahead_taken": self.ahead_taken,
                "spec_pipelined_steps": self.pipelined_steps,
                "spec_ahead_wasted": self.ahead_wasted,
                "spec_accept_rate": self.accepted_tokens / self.draft_tokens
                if self.draft_tokens else 0.0,
                "spec_tokens_per_row": self.emitted_tokens / rows if rows else 0.0,
                "spec_accept_length": self.snapshot()}


@dataclass
class Backoff:
    """Per request: recent accepted tokens per verify (an average over about 8 steps); below
    the threshold the request sits out ``wait`` steps, doubling each time (up to 64), and
    halving again when a retry accepts well. The threshold may change between calls (the cost
    gate's bar: accepted tokens a verify needs to pay on this device, cost.py): a request whose
    average falls below a raised bar backs off too (``hold``)."""

    avg: float = 1.0
    wait: int = 0
    penalty: int = 1

    def skip(self) -> bool:
        if self.wait > 0:
            self.wait -= 1
            return True
        return False

    def update(self, accepted: int, threshold: float) -> None:
        self.avg = _DECAY * self.avg + (1 - _DECAY) * accepted
        if self.avg < threshold:
            self._start(threshold)
        elif accepted:
            self.penalty = max(self.penalty // 2, 1)

    def hold(self, threshold: float) -> bool:
        """Start the wait when, not waiting, the average is below ``threshold`` (a bar that
        rose since the last verify); True: it started."""
        if self.wait > 0 or self.avg >= threshold:
            return False
        self._start(threshold)
        return True

    def _start(self, threshold: float) -> None:
        self.wait = self.penalty
        self.penalty = min(2 * self.penalty, 64)
        self.avg = threshold  # a fresh start after the wait


_DECAY = 0.875
