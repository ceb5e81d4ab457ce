"""Batched jump-forward: a request whose grammar forces text keeps its place in the decode batch,
and the batch's next step feeds the forced tokens (a mixed step: extend rows beside decode rows).

The stand-in model (``HashRunner``) derives each logits row from the token ids stored in the KV
pool, so a wrong slot, position or input token changes the outputs. The reference is the same
requests through the queue (a jump sends the request back for an extend of its own: what a
request with ``min_new_tokens`` still does, since its sampling state follows every output token).
Outputs must be identical, with and without overlap scheduling, and every slot freed after.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.grammar.manager import GrammarManager
from sgdsl.runtime.ipc import messages as m
from sgdsl.runtime.model.forward_batch import ForwardMode
from sgdsl.runtime.sampling_params import SamplingParams

from ..helpers import EOS, VOCAB, run_to_end, shared_compiler
from ..test_batch_step import SCHEMA
from .test_jump_logprobs import HashRunner

N = 12  # above the old jump-forward batch limit (8)


class CountingRunner(HashRunner):
    """Counts mixed steps: decode batches where some request has several query rows.
    ``max_bs``: as a runner with CUDA graphs up to that batch size (the mixed step must fit)."""

    def __init__(self, max_bs: int | None = None) -> None:
        super().__init__(num_slots=4096, max_reqs=16)
        self.mixed = self.eager = 0  # mixed steps; of them, larger than the graphs
        if max_bs is not None:
            self.cuda_graph_runner = SimpleNamespace(max_bs=max_bs)

    def forward(self, b):
        rows = b.req_pool_indices.tolist()
        if b.mode is ForwardMode.DECODE and len(set(rows)) < len(rows):
            self.mixed += 1
            graphs = getattr(self, "cuda_graph_runner", None)
            # extra rows only within the graphs (a batch larger than them runs eager anyway)
            assert graphs is None or len(rows) <= graphs.max_bs or len(set(rows)) > graphs.max_bs
            self.eager += graphs is not None and len(rows) > graphs.max_bs
        return super().forward(b)


def _run(backend, tokenizer, overlap: bool, through_queue: bool,
         max_bs: int | None = None) -> tuple[dict, int, CountingRunner]:
    manager = GrammarManager(backend, tokenizer, VOCAB, [EOS], compiler=shared_compiler(backend))
    requests = []
    for i in range(N):
        prompt = tokenizer.encode(f"Person {i} as JSON: ", add_special_tokens=False)
        sampled = dict(temperature=0.9, seed=i) if i % 3 == 1 else dict(temperature=0.0)
        # min_new_tokens=1 changes nothing here (a JSON value cannot stop at its first token)
        # but sends a jumping request through the queue
        params = SamplingParams(max_new_tokens=64, json_schema=json.dumps(SCHEMA),
                                min_new_tokens=1 if through_queue else 0, **sampled)
        requests.append(m.TokenizedGenerateReq(f"r{i}", prompt, params, stream=i % 4 == 3))
    runner = CountingRunner(max_bs)
    config = EngineConfig(max_running_requests=16, disable_overlap_schedule=not overlap)
    outs = run_to_end(runner, config, manager, requests)
    return outs, manager.stats.jump_forward_tokens, runner


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_jumps_stay_in_the_batch_with_the_outputs_of_the_queue_path(backends, tokenizer,
                                                                    overlap):
    backend = backends["xgrammar"]
    mixed, jumped, runner = _run(backend, tokenizer, overlap, through_queue=False)
    queued, jumped_q, runner_q = _run(backend, tokenizer, overlap, through_queue=True)
    assert runner.mixed > 0 and runner_q.mixed == 0
    assert jumped == jumped_q > N  # every request took several jumps
    assert mixed == queued
    for rid, rec in mixed.items():
        if rec["finish"]["type"] == "stop":
            value = json.loads(tokenizer.decode([t for t in rec["ids"] if t != EOS]))
            assert set(value) == set(SCHEMA["properties"]), rid
    assert sum(rec["finish"]["type"] == "stop" for rec in mixed.values()) >= N // 2


def test_sync_and_overlap_agree_on_mixed_steps(backends, tokenizer):
    backend = backends["xgrammar"]
    assert _run(backend, tokenizer, False, False)[:2] == _run(backend, tokenizer, True, False)[:2]


@pytest.mark.parametrize("overlap,max_bs", [(False, N + 1), (True, N + 1), (True, 4)],
                         ids=["sync", "overlap", "batch-above-graphs"])
def test_forced_tokens_beyond_the_graph_size_wait_a_step(backends, tokenizer, overlap, max_bs):
    """With room for one extra row per step (graphs up to N + 1), jump-forward rows feed their
    tokens over several steps, dropping the tokens sampled meanwhile: same outputs. A batch
    larger than the graphs runs eager anyway and feeds every token at once."""
    backend = backends["xgrammar"]
    tight, jumped, runner = _run(backend, tokenizer, overlap, False, max_bs=max_bs)
    free, jumped_free, _ = _run(backend, tokenizer, overlap, False)
    assert runner.mixed > 0 and jumped == jumped_free
    assert (runner.eager > 0) == (max_bs < N)
    assert tight == free


@pytest.mark.parametrize("name", ["xgrammar", "outlines"])
def test_batch_jump_forward_matches_one_at_a_time(backends, tokenizer, name):
    """Forced tokens accepted one position at a time across requests give each request the
    plan and grammar state ``force_text`` gives it alone (merged with its last token or not,
    cut to its budget)."""
    from sgdsl.runtime.grammar import GrammarKey
    from sgdsl.runtime.grammar.forcing.jump_forward import force_text, jump_forward_batch

    backend = backends[name]
    schema = {**SCHEMA, "properties": {**SCHEMA["properties"], "age": {"type": "integer"}}}
    compiled = backend.compile(GrammarKey.from_constraint("json_schema", json.dumps(schema)))
    texts = ['{"', '{"name": "ab",', '{"name": "ab", "age": 1', '{"name": "x", "age": 12,',
             '{"name": "x", "age": 12, "job": "doctor"', '{"name": "ab']
    if name == "outlines":  # its JSON spelling has no spaces after separators
        texts = [t.replace(": ", ":").replace(", ", ",") for t in texts]
    budgets = [64, 64, 64, 2, 64, 64]

    def prepared():
        out = []
        for text in texts:
            g = backend.new_grammar(compiled)
            ids = tokenizer.encode(text, add_special_tokens=False)
            assert g.accept_tokens(ids), text
            out.append((g, ids))
        return out
    batch, alone = prepared(), prepared()
    plans = jump_forward_batch([g for g, _ in batch], tokenizer, [ids for _, ids in batch],
                               budgets)
    for (g, ids), budget, plan in zip(alone, budgets, plans):
        forced = g.jump_forward_string()
        ref = force_text(g, tokenizer, ids, forced, budget) if forced else None
        assert plan == ref
    assert sum(p is not None for p in plans) >= 4
    for (g, _), (ref, _) in zip(batch, alone):
        assert g.num_accepted == ref.num_accepted
        assert g.jump_forward_string() == ref.jump_forward_string()


def test_grouped_accept_is_all_or_nothing(backends, tokenizer):
    from sgdsl.runtime.grammar import GrammarKey
    from sgdsl.runtime.grammar.base import accept_tokens_grouped

    backend = backends["xgrammar"]
    compiled = backend.compile(GrammarKey.from_constraint("json_schema", json.dumps(SCHEMA)))
    gs = [backend.new_grammar(compiled) for _ in range(3)]
    enc = lambda t: tokenizer.encode(t, add_special_tokens=False)  # noqa: E731
    good, bad = enc('{"name": "a'), enc('{"name": 12')  # a number where a string must go
    assert accept_tokens_grouped(gs, [good, bad, []]) == [True, False, False]
    assert [g.num_accepted for g in gs] == [len(good), 0, 0]


@pytest.mark.parametrize("threads", ["1", "4"])
def test_many_token_accept_split_over_the_pool(backends, tokenizer, monkeypatch, threads):
    """xgrammar's ``accept_tokens_batch`` splits enough tokens over the accept pool, a share
    of the rows per task through all positions: the same results and states as one position
    at a time on this thread (4 threads here even on a 2-core box), failures rolled back."""
    from sgdsl.runtime.grammar import GrammarKey
    from sgdsl.runtime.grammar.base import accept_positions, accept_tokens_grouped

    monkeypatch.setenv("SGDSL_GRAMMAR_FILL_THREADS", threads)
    backend = backends["xgrammar"]
    compiled = backend.compile(GrammarKey.from_constraint("json_schema", json.dumps(SCHEMA)))
    enc = lambda t: tokenizer.encode(t, add_special_tokens=False)  # noqa: E731
    texts = [f'{{"name": "p{i}", "age": {i}, "job": "teacher", "ok": true}}' if i % 5 else
             f'{{"name": "p{i}", "age": {i}, "job": 12' for i in range(24)]  # 12: not a job
    lists = [enc(t) for t in texts]
    assert sum(map(len, lists)) >= 4 * 32  # enough for 4 tasks
    gs = [backend.new_grammar(compiled) for _ in lists]
    refs = [backend.new_grammar(compiled) for _ in lists]
    oks = accept_tokens_grouped(gs, lists)
    want = accept_positions(refs, lists, lambda g, t: [x.accept_token(y) for x, y in zip(g, t)])
    assert oks == want == [bool(i % 5) for i in range(24)]
    assert [g.num_accepted for g in gs] == [len(ids) if ok else 0 for ids, ok in zip(lists, oks)]
    for g, ref in zip(gs, refs):
        assert g.jump_forward_string() == ref.jump_forward_string()
        assert g.state_key() == ref.state_key()
