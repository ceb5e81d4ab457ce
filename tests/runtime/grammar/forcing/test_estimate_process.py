"""The completion-estimate worker process (runtime/grammar/forcing/estimate_process.py and
estimate_worker.py): its answers are the search this process would make, a job it has not
been sent is searched by the caller, and a dead worker turns into "search here" with its reason,
leaving no process behind."""
from __future__ import annotations

import json
import time

import pytest

from sgdsl.runtime.grammar import GrammarKey
from sgdsl.runtime.grammar.forcing.estimate import EstimateJobs
from sgdsl.runtime.grammar.forcing.shortest import CompletionSearch

from ..helpers import EOS, VOCAB, shared_compiler

SCHEMA = {"type": "object", "required": ["name", "tags"],
          "properties": {"name": {"type": "string"}, "tags": {"type": "array", "minItems": 2,
                                                             "items": {"type": "string"}}}}
KEY = GrammarKey("json_schema", json.dumps(SCHEMA))


@pytest.fixture
def jobs(backends, tokenizer):
    jobs = EstimateJobs(CompletionSearch(tokenizer, VOCAB, [EOS]), backends["xgrammar"])
    yield jobs
    jobs.shutdown()


def _state(backends, tokenizer, text: str):
    grammar = shared_compiler(backends["xgrammar"]).compile(KEY)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert grammar.accept_tokens(ids)
    return grammar, ids


def test_the_worker_answers_what_this_process_would_find(jobs, backends, tokenizer):
    assert jobs.worker.wait_ready(120), jobs.worker.dead
    for text in ('{"name": "Ada', '{"name": "Ada", "tags": ["x"', '{"name": "Ada", "tags": ['):
        grammar, ids = _state(backends, tokenizer, text)
        pending = jobs.submit(grammar, ids, (text,), False, KEY)
        answered, found = jobs.worker.outcome(pending.job)
        assert answered, text
        assert found == jobs._search.fresh(grammar) and found is not None, text
        assert grammar.copy().accept_tokens(found.token_ids)
    assert jobs.submitted == 3


def test_a_job_not_sent_yet_is_searched_by_its_caller(jobs, backends, tokenizer):
    """Asked while the worker starts: ``answer`` cancels the job and searches the kept copy."""
    grammar, ids = _state(backends, tokenizer, '{"name": "Ada", "tags": ["x", "y"')
    pending = jobs.submit(grammar, ids, ("b",), False, KEY)
    found = jobs.answer(pending)
    assert found is not None and found == jobs._search.fresh(grammar)
    assert jobs.answered in (0, 1)  # 1 only if the worker came up and answered in between


def test_a_mismatched_state_is_not_sent(jobs, backends, tokenizer):
    grammar, ids = _state(backends, tokenizer, '{"name": "A')
    assert jobs.submit(grammar, ids[:-1], ("c",), False, KEY) is None


def test_a_dead_worker_means_searching_here(jobs, backends, tokenizer):
    assert jobs.worker.wait_ready(120), jobs.worker.dead
    proc = jobs.worker._handle.proc
    proc.kill()
    proc.wait(timeout=10)
    grammar, ids = _state(backends, tokenizer, '{"name": "Ada", "tags": ["x"')
    deadline = time.monotonic() + 10
    while jobs.worker.dead is None and time.monotonic() < deadline:
        pending = jobs.submit(grammar, ids, ("d",), False, KEY)
        if pending is not None:  # sent before the death was noticed: searched here
            assert jobs.answer(pending) == jobs._search.fresh(grammar)
            jobs.taken(pending)
        time.sleep(0.05)
    assert "exited" in (jobs.worker.dead or "") and "SIGKILL" in jobs.worker.dead
    assert jobs.submit(grammar, ids, ("e",), False, KEY) is None


def test_shutdown_leaves_no_process(backends, tokenizer):
    jobs = EstimateJobs(CompletionSearch(tokenizer, VOCAB, [EOS]), backends["xgrammar"])
    assert jobs.worker.wait_ready(120), jobs.worker.dead
    proc = jobs.worker._handle.proc
    jobs.shutdown()
    assert proc.wait(timeout=10) is not None
    assert jobs.worker.dead == "shut down"
