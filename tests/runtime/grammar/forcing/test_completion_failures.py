"""The completion tracker after repeated failed searches (runtime/grammar/forcing/completion.py): far
from the end of the budget it backs off and stops searching deep; in the last quarter it keeps
searching and may search deep again (a few times), so a request whose earlier searches all
failed still gets a completion to force before its budget ends."""
from __future__ import annotations

import json
from types import SimpleNamespace

from sgdsl.runtime.grammar import GrammarKey
from sgdsl.runtime.grammar.forcing.budget import Budget
from sgdsl.runtime.grammar.forcing.completion import CompletionConfig, CompletionTracker
from sgdsl.runtime.sampling_params import SamplingParams

from ..helpers import EOS, VOCAB, shared_compiler

TREE = {"type": "object", "required": ["name", "kids"],
        "properties": {"name": {"type": "string"},
                       "kids": {"type": "array", "items": {"$ref": "#"}}}}
PREFIX = '{"name": "", "kids": [' * 12  # deeper than 8 expansions reach


def _setup(backends, tokenizer, max_new: int):
    key = GrammarKey("json_schema", json.dumps(TREE))
    grammar = shared_compiler(backends["xgrammar"]).compile(key)
    ids = tokenizer.encode(PREFIX, add_special_tokens=False)
    assert grammar.accept_tokens(ids)
    tracker = CompletionTracker(tokenizer, VOCAB, [EOS], CompletionConfig(
        max_expansions=8, async_estimates=False))
    params = SamplingParams(max_new_tokens=max_new, json_schema=json.dumps(TREE))
    req = SimpleNamespace(output_ids=list(ids), sampling_params=params, return_logprob=False,
                          completion=Budget(failures=4, peak=8, search_at=0, check_at=0))
    return tracker, req, grammar


def test_far_from_the_end_failures_back_off(backends, tokenizer):
    tracker, req, grammar = _setup(backends, tokenizer, max_new=400)
    assert tracker.plan(req, grammar) is None
    budget = req.completion
    assert budget.plan is None and budget.failures == 5
    assert tracker.search.deep_searches == 0 and budget.search_at == len(req.output_ids) + 64


def test_in_the_last_quarter_a_deep_search_comes_back(backends, tokenizer):
    n = len(tokenizer.encode(PREFIX, add_special_tokens=False))
    tracker, req, grammar = _setup(backends, tokenizer, max_new=n + 30)  # 4 * n >= 3 * max
    forced = tracker.plan(req, grammar)
    budget = req.completion
    assert tracker.search.deep_searches == 1 and budget.last_resorts == 1
    assert budget.plan is not None and json.loads(PREFIX + budget.plan), budget.plan
    assert budget.failures == 0 and budget.need > 0
    if forced is not None:  # so close to the end that it is applied at once
        assert grammar.is_completed() and len(forced.token_ids) < 30


def test_last_resorts_are_bounded_and_searches_keep_coming(backends, tokenizer):
    n = len(tokenizer.encode(PREFIX, add_special_tokens=False))
    tracker, req, grammar = _setup(backends, tokenizer, max_new=n + 24)
    tracker.search.deep_seconds = 0.0  # every deep search now finds nothing
    for _ in range(5):
        req.completion.search_at = req.completion.check_at = 0
        tracker.plan(req, grammar)
    budget = req.completion
    assert budget.plan is None and budget.last_resorts == 3
    assert tracker.search.deep_searches == 3
    assert budget.search_at <= n + 24 // 4  # not backed off past the end of the budget
