"""Whether the next verify, built ahead for a guessed outcome (prebuild.py), is launched at
once, before this step's samples are read: the device then runs it right after this one, and
the next step, when the guess held, only reads it (its host work overlaps the device, as a
plain decode step's does under overlap scheduling).

A launched batch is exactly the forward the next step would launch when its guess holds (the
same tokens at the same positions over the same KV; ``AheadBatch.matches`` decides, as for a
batch built ahead and not launched); when the guess fails the forward ran for nothing (its KV
went to slots of its own, freed then) and the device spends one verify on it. So it pays only
on a device that runs ahead of the host, and only where nothing of this step's result is read
after the next forward overwrote it:

- ``$SGDSL_SPEC_PIPELINE=1`` (the default is off until an H200 run has measured it and run its
  GPU tests: it landed after the last GPU run; the next session's command is in
  benchmarks/RESULTS.md, spec-step's section); on the CPU a forward is the host's own time, so
  a wrong guess would cost a whole one: there it is for tests only;
- overlap scheduling on;
- every request greedy without penalties (the samples need no per-row state: the argmax), no
  logprobs owed (they read this step's logits, which the next forward's would replace in the
  graphs' buffers), no grammar (prebuild.py builds nothing ahead for one);
- a batch of at most ``_MAX_BATCH`` requests (every one's guess must hold) while at least
  ``_MIN_RATE`` of the recent batches built ahead were taken (``guess_rate``, measured on every
  batch built ahead, launched or not, so it recovers): a request the model stops copying
  (NGRAM's low-acceptance stretches) would otherwise double the device's work per step.
"""
from __future__ import annotations

import os
from typing import Any


_MAX_BATCH = 4
_MIN_RATE = 0.5
_KEEP = 0.875  # weight of the older guesses in ``guess_rate``


def may_pipeline(decoder: Any, sched: Any) -> bool:
    if decoder.pipeline is None:
        flag = os.environ.get("SGDSL_SPEC_PIPELINE")
        decoder.pipeline = flag == "1"
    running = sched.running
    if not decoder.pipeline or not sched.overlap or len(running) > _MAX_BATCH \
            or decoder.guess_rate < _MIN_RATE:
        return False
    info = running.info
    return running.sync_rows == 0 and info.all_greedy and info.penalties.is_empty


def note_guess(decoder: Any, taken: bool) -> None:
    """A batch built ahead was taken by its step (its guess held), or not."""
    decoder.guess_rate = _KEEP * decoder.guess_rate + (1 - _KEEP) * taken
