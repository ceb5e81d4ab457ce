"""The speculative step's cheaper host work: NGRAM's vectorized lookup finds what the per-depth
loop found, a lookup prefetched while the device verifies (on a guess of the accepted tokens)
is taken only when the ids turn out to be the guessed ones and then equals a fresh lookup, and
a scheduler speculating on a copy workload takes prefetched lookups and batches built ahead
(launched before the last step is read, or not), sends each step's outputs during the next,
with outputs equal to plain decoding's (stand-in
model: every token read back from its KV slot, so a batch taken with wrong columns or slots
changes them), and frees a batch built ahead when its request aborts (idle invariant)."""
from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.speculative.ngram import NgramDrafter, _lookup
from sgdsl.runtime.speculative.readback import VerifyRead

from sgdsl.runtime.scheduler.scheduler import Scheduler

from scheduler.standin import EOS, Harness, StandInRunner


def _reference(ids: list[int], lo: int, hi: int, length: int, breadth: int) -> list[list[int]]:
    """The lookup as first written: one pass per match depth, dropping candidates."""
    n = len(ids)
    if n < 2:
        return []
    a = np.array(ids, dtype=np.int64)
    cand = np.flatnonzero(a[:n - 1] == a[n - 1])
    size = np.ones(cand.shape[0], dtype=np.int64)
    alive = cand.copy()
    for d in range(1, min(hi, n - 1)):
        ok = (alive >= d) & (a[np.maximum(alive - d, 0)] == a[n - 1 - d])
        if not ok.any():
            break
        size[ok & (size == d)] += 1
        alive = np.where(ok, alive, -1 - n)
    best = int(size.max()) if size.size else 0
    if best < lo:
        return []
    out: list[list[int]] = []
    for end in (cand[size == best][::-1] + 1).tolist():
        cont = ids[end:min(end + length, n)]
        cont = [cont[j % len(cont)] for j in range(length)] if cont else cont
        if cont and all(c[0] != cont[0] for c in out):
            out.append(cont)
        if len(out) == breadth:
            break
    return out


def test_vectorized_lookup_matches_the_per_depth_loop():
    rng = random.Random(7)
    for _ in range(1500):
        ids = [rng.randrange(rng.choice([2, 3, 6, 40])) for _ in range(rng.randint(1, 50))]
        lo, hi = rng.randint(1, 3), rng.randint(1, 12)
        length, breadth = rng.randint(1, 6), rng.randint(1, 3)
        got = _lookup(np.array(ids + [0] * 3, dtype=np.int64), len(ids), lo, hi, length,
                      breadth)
        assert got == _reference(ids, lo, hi, length, breadth), (ids, lo, hi, length, breadth)


def test_prefetched_lookup_is_taken_only_on_the_guessed_ids():
    """Every step's proposal equals a fresh drafter's on the same ids, whatever the step
    accepted (all and the guessed bonus: a hit; fewer, another bonus, a respelled tail: a
    fresh lookup)."""
    rng = random.Random(3)
    for breadth in (1, 2):
        config = EngineConfig(speculative_algorithm="ngram",
                              speculative_ngram_max_bfs_breadth=breadth)
        drafter, hits = NgramDrafter(config), 0
        text = [rng.randrange(12) for _ in range(60)]
        req = SimpleNamespace(rid="r", all_ids=text[:20])
        for _ in range(120):
            tree = drafter.propose([req], 4)[0]
            fresh = NgramDrafter(config).propose([SimpleNamespace(rid="x",
                                                                  all_ids=req.all_ids)], 4)[0]
            assert tree == fresh
            drafter.prefetch([req], [tree])
            kind = rng.random()
            if kind < 0.6 and tree:  # copy on: the whole first branch, then its next token
                m = next((i for i, p in enumerate(tree.parents) if p != i - 1), len(tree))
                cont = drafter.last["r"][0]
                new = list(tree.tokens[:m]) + [cont[m]]
                hits += 1
            elif kind < 0.9:
                new = [rng.randrange(12) for _ in range(rng.randint(1, 3))]
            else:  # jump-forward respelled the tail: the index is rebuilt
                req.all_ids = req.all_ids[:-2] + [rng.randrange(12, 20)]
                new = []
            req.all_ids = req.all_ids + new
        drafter.propose([req], 4)
        assert drafter.prefetch_hits >= hits > 10
        drafter.release("r")
        assert drafter.check_idle() == []


def test_verify_read_on_the_host():
    read = VerifyRead()
    read.start(torch.tensor([5, 6, 7]))
    assert read.wait() == [5, 6, 7]


PROMPT_LEN, VOCAB, DEVIATE = 40, 50, 9


class CopyStandIn(StandInRunner):
    """Answers as a copy of the prompt from its start (read back from the KV slots), one token
    in ``DEVIATE`` changed: NGRAM drafts it, and some drafts are wrong."""

    def logits(self, seqs):
        want = []
        for seq in seqs:
            j = len(seq) - PROMPT_LEN
            tok = seq[j % PROMPT_LEN] if j >= 0 else 1
            want.append((tok + 1) % VOCAB if j % DEVIATE == DEVIATE - 1 else tok)
        target = torch.tensor(want, dtype=torch.int64)
        return -0.5 * (torch.arange(VOCAB).view(1, -1) - target.view(-1, 1)).abs().float()


def _copy_run(spec: bool, pipeline: bool = False) -> tuple[dict, dict]:
    runner = CopyStandIn(2048)
    cfg = dict(speculative_algorithm="ngram", speculative_min_speedup=0) if spec else {}
    h = Harness(None, runner)  # type: ignore[arg-type]
    h.sched = Scheduler(runner, EngineConfig(**cfg), [EOS], None, h.send)
    if spec:  # pipeline.py: on the CPU only when asked (a forward is the host's own time)
        h.sched.spec.pipeline = pipeline
    rng = random.Random(11)
    for i in range(3):
        h.submit(f"r{i}", [rng.randrange(1, VOCAB) for _ in range(PROMPT_LEN)],
                 max_new_tokens=70, ignore_eos=True)
    h.run()
    # alone (batch 1: launched ahead), finishing inside a step's accepted draft: a stop token
    # (the copy's 30th token), then max_new_tokens mid-draft
    prompt = rng.sample(range(1, VOCAB), PROMPT_LEN)  # distinct: the stop token comes late
    h.submit("stop", prompt, max_new_tokens=70, stop_token_ids=[prompt[29]], ignore_eos=True)
    h.run()
    h.submit("len", prompt[::-1], max_new_tokens=37, ignore_eos=True)
    h.run()
    h.check_idle()
    return h.outs, h.sched.stats()


def test_copy_workload_takes_prefetched_lookups_with_plain_outputs():
    plain, _ = _copy_run(spec=False)
    got, stats = _copy_run(spec=True)
    assert got == plain
    assert stats["spec_verify_steps"] > 0
    assert stats["spec_draft_prefetch_hits"] > 0
    # batches built ahead: taken exactly when the guess held (the others were freed: idle)
    assert 0 < stats["spec_ahead_taken"] <= stats["spec_ahead_built"]
    assert stats["spec_outputs_held"] > 0


def test_pipelined_verifies_equal_plain_decoding(monkeypatch):
    """The next verify launched before this one is read (for the guessed outcome): taken when
    the guess held, its forward wasted (slots freed) when not; outputs as plain decoding's,
    with finishes (a stop token, max_new_tokens) inside a launched step's draft. The stand-in
    computes each forward at its launch from the KV as it is then, so a launched batch reading
    a column this step had not written yet would change the outputs. (Every batch built ahead
    is launched here, however often the guesses failed.)"""
    from sgdsl.runtime.speculative import pipeline
    monkeypatch.setattr(pipeline, "_MIN_RATE", 0.0)
    plain, _ = _copy_run(spec=False)
    got, stats = _copy_run(spec=True, pipeline=True)
    assert got == plain
    assert stats["spec_pipelined_steps"] > 5 and stats["spec_ahead_wasted"] > 5
    assert stats["spec_pipelined_steps"] == stats["spec_ahead_taken"]


def test_pipelining_stops_while_guesses_fail():
    """The launches ahead stop after a few guesses failed in a row (a request the model stops
    copying) and start again after a few held: the rate is kept over every batch built ahead,
    launched or not, so it can recover."""
    from sgdsl.runtime.speculative.pipeline import note_guess

    decoder = SimpleNamespace(guess_rate=1.0)
    for _ in range(6):
        note_guess(decoder, False)
    assert decoder.guess_rate < 0.5
    for _ in range(6):
        note_guess(decoder, True)
    assert decoder.guess_rate >= 0.5


@pytest.mark.parametrize("pipeline", [False, True])
def test_held_outputs_stream_once_and_abort_mid_stream(pipeline):
    """A speculative step's outputs go out during the next step: every token streams once, in
    order (a prefix of plain decoding's for the aborted request), and an abort between a step
    and its held outputs loses nothing but the aborted request's tail."""
    plain, _ = _copy_run(spec=False)
    runner = CopyStandIn(2048)
    h = Harness(None, runner)  # type: ignore[arg-type]
    h.sched = Scheduler(runner, EngineConfig(speculative_algorithm="ngram",
                                             speculative_min_speedup=0), [EOS], None, h.send)
    h.sched.spec.pipeline = pipeline
    rng = random.Random(11)
    for i in range(3):
        h.submit(f"r{i}", [rng.randrange(1, VOCAB) for _ in range(PROMPT_LEN)],
                 max_new_tokens=70, ignore_eos=True)
    for _ in range(40):  # until a step held its outputs and built the next batch ahead
        h.sched.step()
        pending = h.sched.pending
        if pending is not None and pending.spec_outputs and h.sched.spec.ahead is not None:
            break
    assert h.sched.pending is not None and h.sched.pending.spec_outputs
    ahead = h.sched.spec.ahead  # the next verify batch, built during the last one
    assert ahead is not None and ahead.holds(h.sched.running.reqs[1])
    h.sched.abort("r1", "client left")
    assert h.sched.spec.ahead is None  # its KV went back with the request
    h.run()
    h.check_idle()
    assert h.finish["r1"]["type"] == "abort"
    assert h.outs["r1"] == plain["r1"][:len(h.outs["r1"])]
    assert h.outs["r0"] == plain["r0"] and h.outs["r2"] == plain["r2"]
    assert h.sched.stats()["spec_outputs_held"] > 0
