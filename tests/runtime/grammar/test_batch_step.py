"""The per-step grammar hot path: batch fill and batch accept give what the per-request calls
give, the cheap stop-only check, and constrained decoding with overlap scheduling producing the
same outputs as synchronous scheduling (with and without jump-forward, mixed with
unconstrained rows), over a stand-in model whose logits depend on the KV actually stored."""
from __future__ import annotations

import json

import pytest
import torch

from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.grammar import GrammarKey, allocate_bitmask, only_stop_allowed
from sgdsl.runtime.grammar.manager import GrammarManager
from sgdsl.runtime.ipc import messages as m
from sgdsl.runtime.sampling_params import SamplingParams

from .helpers import EOS, VOCAB, feed_text, run_to_end, shared_compiler
from .forcing.test_jump_logprobs import HashRunner

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6}, "age": {"type": "integer", "maximum": 99},
    "job": {"enum": ["engineer", "teacher", "doctor"]}, "ok": {"type": "boolean"}},
    "required": ["name", "age", "job", "ok"], "additionalProperties": False}
PREFIXES = ['', '{"name": "', '{"name": "ab", "age": 1', '{"name": "x", "age": 12, "job": "']


def _grammars(backend, n: int):
    compiled = backend.compile(GrammarKey.from_constraint("json_schema", SCHEMA))
    return [backend.new_grammar(compiled) for _ in range(n)]


# NOTE: the text prefixes are xgrammar's JSON spelling (fixed ", " / ": " separators); the
# outlines backend uses the default loops of these hooks, covered by the scheduler test below.
def test_batch_fill_matches_row_fill(backends, tokenizer):
    gs = _grammars(backends["xgrammar"], len(PREFIXES))
    for g, text in zip(gs, PREFIXES):
        assert feed_text(g, tokenizer, text)
    rows = [3, 0, 5, 2]  # scattered rows; rows 1 and 4 stay open
    batch = allocate_bitmask(6, VOCAB)
    type(gs[0]).fill_bitmask_batch(gs, batch, rows)
    single = allocate_bitmask(6, VOCAB)
    for g, r in zip(gs, rows):
        g.fill_bitmask(single, r)
    assert torch.equal(batch, single)
    assert (batch[1] == -1).all() and (batch[4] == -1).all()


def test_batch_accept_matches_single_accept(backends, tokenizer):
    gs, ref = _grammars(backends["xgrammar"], 3), _grammars(backends["xgrammar"], 3)
    tokens = [tokenizer.encode('{"', add_special_tokens=False)[0],
              tokenizer.encode("x", add_special_tokens=False)[0],  # not a JSON start
              tokenizer.encode("{", add_special_tokens=False)[0]]
    oks = type(gs[0]).accept_token_batch(gs, tokens)
    assert oks == [r.accept_token(t) for r, t in zip(ref, tokens)] == [True, False, True]
    assert [g.num_accepted for g in gs] == [1, 0, 1]


def test_parallel_batch_accept_keeps_row_order(backends, tokenizer, monkeypatch):
    monkeypatch.setenv("SGDSL_GRAMMAR_FILL_THREADS", "2")  # 2 chunks of 40 rows, in threads
    gs = _grammars(backends["xgrammar"], 80)
    good = tokenizer.encode('{"', add_special_tokens=False)[0]
    bad = tokenizer.encode("x", add_special_tokens=False)[0]
    tokens = [bad if i % 7 == 3 else good for i in range(80)]
    oks = type(gs[0]).accept_token_batch(gs, tokens)
    assert oks == [i % 7 != 3 for i in range(80)]
    assert [g.num_accepted for g in gs] == [int(ok) for ok in oks]


def test_only_stop_allowed_without_unpacking(backends, tokenizer):
    g = _grammars(backends["xgrammar"], 1)[0]
    assert feed_text(g, tokenizer, '{"name": "a", "age": 3, "job": "doctor", "ok": true')
    assert not only_stop_allowed(g, VOCAB, [EOS])  # "}" is still required
    assert feed_text(g, tokenizer, "}")
    assert only_stop_allowed(g, VOCAB, [EOS])
    assert not only_stop_allowed(g, VOCAB, [])  # the stop token itself is a continuation


def _run(backend, tokenizer, overlap: bool, jump: bool, n: int = 5, max_new: int = 48,
         **kw) -> dict:
    manager = GrammarManager(backend, tokenizer, VOCAB, [EOS], jump_forward=jump,
                             compiler=shared_compiler(backend), **kw)
    requests = []
    for i in range(n):
        prompt = tokenizer.encode(f"Person {i} as JSON: ", add_special_tokens=False)
        sampled = dict(temperature=0.9, seed=i) if i % 2 else dict(temperature=0.0)
        extra = {} if i in (2, 5) else {"json_schema": json.dumps(SCHEMA)}  # mixed batch
        params = SamplingParams(max_new_tokens=max_new, **sampled, **extra)
        requests.append(m.TokenizedGenerateReq(f"r{i}", prompt, params, stream=i == 3))
    config = EngineConfig(max_running_requests=8, disable_overlap_schedule=not overlap)
    outs = run_to_end(HashRunner(num_slots=2048), config, manager, requests, 1000)
    outs["jumped"] = manager.stats.jump_forward_tokens
    return outs


@pytest.mark.parametrize("jump,max_new", [(False, 48), (True, 48), (True, 30)],
                         ids=["mask-only", "jump-forward", "forced-completion"])
def test_overlap_matches_sync_under_grammar(backends, tokenizer, jump, max_new):
    """``forced-completion``: a budget too small for the values, so completions are forced
    (jumps that finish requests, their replaced token's KV possibly in flight)."""
    backend = backends["xgrammar"]
    sync = _run(backend, tokenizer, overlap=False, jump=jump, max_new=max_new)
    overlapped = _run(backend, tokenizer, overlap=True, jump=jump, max_new=max_new)
    assert sync.pop("jumped") == overlapped.pop("jumped")
    assert sorted(sync) == [f"r{i}" for i in range(5)]
    assert overlapped == sync
    stopped = [rec for rid, rec in sync.items() if rid not in ("r2", "r5")
               and rec["finish"]["type"] == "stop"]
    # the greedy ones at least (a sampled one may run to length); under a tight budget a
    # forced completion also finishes with a stop, and every stopped output parses
    assert len(stopped) >= (2 if max_new == 48 else 0)
    for rec in stopped:
        value = json.loads(tokenizer.decode([t for t in rec["ids"] if t != EOS]))
        assert set(value) == set(SCHEMA["properties"])


def test_lone_request_jumping_on_the_last_read_still_finishes(backends, tokenizer):
    """With overlap, a jump found when the last step in flight is read (nothing else left to
    launch) sends the request back to the queue: the scheduler must keep stepping."""
    outs = _run(backends["xgrammar"], tokenizer, overlap=True, jump=True, n=1)
    assert outs["r0"]["finish"]["type"] == "stop"
    value = json.loads(tokenizer.decode([t for t in outs["r0"]["ids"] if t != EOS]))
    assert set(value) == set(SCHEMA["properties"])


def test_no_jump_forward_above_the_batch_limit(backends, tokenizer):
    """Above ``jump_max_batch`` decoding requests, forced text is sampled, not jumped."""
    # (forced completions, which count as forced tokens too, are off here)
    capped = _run(backends["xgrammar"], tokenizer, overlap=True, jump=True, jump_max_batch=0,
                  completion=None)
    assert capped.pop("jumped") == 0
    free = _run(backends["xgrammar"], tokenizer, overlap=True, jump=True, completion=None)
    assert free.pop("jumped") > 0
    assert sorted(capped) == sorted(free) == [f"r{i}" for i in range(5)]


def _prefetch_case(backend, tokenizer, prefetched: bool):
    """Four requests after one more sampled token each: inside a string, closing the value
    (only the stop token may follow), a string's first letter (due for a completion
    measurement: no budget yet), a token the grammar rejects."""
    from sgdsl.runtime.grammar.forcing.budget import Budget
    from sgdsl.runtime.scheduler.finish import FinishChecker
    from sgdsl.runtime.scheduler.req import Req

    cases = [('{"name": "ab', "c"), ('{"name": "x", "age": 12, "job": "doctor", "ok": true', "}"),
             ('{"name": "', "x"), ('{"name": "ab", "age": 1', "x")]
    manager = GrammarManager(backend, tokenizer, VOCAB, [EOS], jump_forward=False,
                             compiler=shared_compiler(backend))
    compiled = backend.compile(GrammarKey.from_constraint("json_schema", SCHEMA))
    reqs = []
    for i, (text, nxt) in enumerate(cases):
        req = Req(f"r{i}", [1, 2], SamplingParams(json_schema=json.dumps(SCHEMA),
                                                  max_new_tokens=64))
        req.grammar = backend.new_grammar(compiled)
        assert feed_text(req.grammar, tokenizer, text)
        req.output_ids = tokenizer.encode(text, add_special_tokens=False) + [
            tokenizer.encode(nxt, add_special_tokens=False)[-1]]
        if i != 2:
            req.completion = Budget(check_at=1 << 30, search_at=1 << 30)
        reqs.append(req)
    prefetch = manager.prefetch(reqs) if prefetched else None
    if prefetch is not None:  # its rows start undefined: garbage must not survive the step
        prefetch.bitmask.fill_(0x1234)
    manager.after_sample(reqs, FinishChecker([EOS], None), batch_size=len(reqs),
                         prefetch=prefetch)
    bitmask = manager.fill_bitmask(reqs, None, prefetch)
    deferred = list(manager.deferred)  # the scheduler measures these after its launch
    measured, requeued = manager.plan_deferred(FinishChecker([EOS], None))
    assert measured == deferred and not requeued and manager.deferred == []
    manager.shutdown()
    return reqs, bitmask, (prefetch, deferred)


def test_prefetched_rows_match_the_scheduler_thread(backends, tokenizer):
    """Rows handed to the mask prefetch (accepted and filled on a helper thread) come out as on
    the scheduler thread: same bitmask rows, a rejected token aborts, a value down to its stop
    token finishes with it; the request due for a completion measurement is handed over too,
    and measured once the step's sampling is launched (``plan_deferred``); without a prefetch
    it is measured on the scheduler thread at once."""
    backend = backends["xgrammar"]
    ref, ref_mask, (_, ref_deferred) = _prefetch_case(backend, tokenizer, prefetched=False)
    got, mask, (prefetch, deferred) = _prefetch_case(backend, tokenizer, prefetched=True)
    # rows 0 and 2 handed over (2 due for a measurement), 1 finished, 3 rejected
    assert prefetch is not None and prefetch.filled == {0, 2}
    assert ref_deferred == [] and deferred == [got[2]]
    assert [r.finish_reason for r in got] == [r.finish_reason for r in ref]
    assert [r.finish_reason and r.finish_reason["type"] for r in got] == [
        None, "stop", None, "abort"]
    assert [r.output_ids for r in got] == [r.output_ids for r in ref]
    assert got[1].output_ids[-1] == EOS and got[1].forced_positions
    for row in (0, 2):  # the rows still decoding
        assert torch.equal(mask[row], ref_mask[row])
    assert (mask[1] == -1).all() and (mask[3] == -1).all()  # left the step: open
    assert got[2].completion is not None and ref[2].completion is not None  # measured
    assert got[2].completion.plan == ref[2].completion.plan


def test_and_rows_over_runs_and_threads():
    """The JSON filter is and-ed in place over runs of adjacent rows, split over threads."""
    import numpy as np

    from sgdsl.runtime.grammar.backends.xgrammar_threads import and_rows as _and_rows

    rng = np.random.default_rng(0)
    words = rng.integers(-2**31, 2**31 - 1, size=(300, 70), dtype=np.int32)
    filt = rng.integers(-2**31, 2**31 - 1, size=70, dtype=np.int32)
    rows = sorted(set(rng.integers(0, 300, 220).tolist()) | set(range(40, 140)))
    expected = words.copy()
    expected[rows] &= filt
    _and_rows(words, rows, filt)
    assert (words == expected).all()


def test_engine_config_sets_the_jump_batch_limit(tokenizer, tmp_path):
    """``EngineConfig.grammar_jump_max_batch`` reaches the scheduler's GrammarManager (default:
    jump forward at every batch size)."""
    from sgdsl.runtime.grammar.manager import create_grammar_manager

    made = []
    try:
        for limit in (None, 64):
            config = EngineConfig(grammar_backend="xgrammar", grammar_jump_max_batch=limit,
                                  grammar_compile_workers=1, grammar_cache_dir=str(tmp_path))
            made.append(create_grammar_manager(config, tokenizer, VOCAB, [EOS]))
        assert [(g.jump_forward, g.jump_max_batch) for g in made] == [(True, None), (True, 64)]
    finally:
        for manager in made:
            manager.shutdown()
