"""Forced completion (runtime/grammar/forcing/completion.py) through the real Scheduler and
GrammarManager, with a stand-in model that samples pseudo-random tokens (long strings, endless
digits: the worst case for a budget): every constrained output is a complete value that
finishes with its stop token when the budget allows one, on both backends, with and without
logprobs; with completion off the same requests are cut. The repetition guard ends a runaway
string early."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.errors import InvalidRequestError
from sgdsl.runtime.grammar.forcing.completion import CompletionConfig
from sgdsl.runtime.grammar.manager import GrammarManager
from sgdsl.runtime.ipc import messages as m
from sgdsl.runtime.sampling_params import SamplingParams
from sgdsl.runtime.scheduler.scheduler import Scheduler

from ..helpers import EOS, VOCAB, shared_compiler
from .test_jump_logprobs import HashRunner, _check_logprobs

PERSON = {"type": "object", "required": ["name", "age", "tags"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                         "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1}}}
SENTENCE = r"[a-z]+( [a-z]+)*\."
PROMPT = [19161, 357, 42, 216]  # "Write it: "
# (constraint, budget): budgets a few tokens above each shortest completion.
REQUESTS = [({"json_schema": json.dumps(PERSON)}, 26), ({"json_schema": json.dumps(PERSON)}, 40),
            ({"regex": SENTENCE}, 6), ({"regex": r"-?[0-9]+(\.[0-9]+)?"}, 5),
            ({"json_schema": '{"type": "object"}'}, 12),
            ({"json_schema": json.dumps({"type": "array", "items": {"type": "number"}})}, 10)]


def _run(backend, tokenizer, completion: CompletionConfig, reqs, logprob: bool = False,
         runner=None, warm: bool = False) -> tuple[list, GrammarManager]:
    """``warm``: the estimate worker is up before the first request (else it starts with
    it, and estimates asked meanwhile are searched in this process)."""
    manager = GrammarManager(backend, tokenizer, VOCAB, [EOS], completion=completion,
                             compiler=shared_compiler(backend))
    if warm:
        assert manager.completion.jobs.worker.wait_ready(120), manager.completion.jobs.worker.dead
    outs: dict[str, dict] = {}

    def send(msg) -> None:
        for o in msg.outs:
            rec = outs.setdefault(o.rid, {"ids": [], "lps": [], "finish": None})
            rec["ids"] += o.new_ids
            rec["lps"] += o.output_token_logprobs or []
            rec["finish"] = o.finish_reason or rec["finish"]
    sched = Scheduler(runner or HashRunner(num_slots=4096, max_reqs=16), EngineConfig(
        max_running_requests=16), [EOS], lambda ids: tokenizer.decode(ids), send,
        grammar=manager)
    prompt = PROMPT
    for i, (constraint, budget) in enumerate(reqs):
        params = SamplingParams(temperature=1.0, seed=i, max_new_tokens=budget, **constraint)
        sched.handle(m.TokenizedGenerateReq(f"r{i}", prompt, params, return_logprob=logprob))
    for _ in range(2000):
        if not sched.step():
            break
    manager.shutdown()
    assert sched._integrity_resp(0).ok  # every request finished and freed its KV
    return [outs[f"r{i}"] for i in range(len(reqs))], manager


def _check_value(constraint: dict, text: str) -> None:
    if "regex" in constraint:
        assert re.fullmatch(constraint["regex"], text), text
    else:
        jsonschema.validate(json.loads(text), json.loads(constraint["json_schema"]))


@pytest.mark.parametrize("logprob", [False, True], ids=["plain", "logprobs"])
def test_random_model_always_completes(backend, tokenizer, logprob):
    results, manager = _run(backend, tokenizer, CompletionConfig(), REQUESTS, logprob)
    for (constraint, budget), res in zip(REQUESTS, results):
        assert res["finish"]["type"] == "stop", (constraint, tokenizer.decode(res["ids"]))
        assert len(res["ids"]) <= budget
        # NOTE: a logprob request may end complete without a stop token it did not sample
        # (finish reason "stop", matched None); every other one ends with its stop token.
        ended = res["ids"][-1] == EOS
        assert ended or logprob and res["finish"]["matched"] is None
        _check_value(constraint, tokenizer.decode(res["ids"][:-1] if ended else res["ids"]))
        if logprob:  # forced tokens were scored too, each as a plain forward scores it
            _check_logprobs(PROMPT, res["ids"], res["lps"])
    assert manager.completion.forced >= len(REQUESTS) // 2


def test_without_completion_the_budget_cuts(backend, tokenizer):
    results, _ = _run(backend, tokenizer, CompletionConfig(enabled=False), REQUESTS)
    assert sum(r["finish"]["type"] == "length" for r in results) >= len(REQUESTS) // 2


class OneTokenRunner(HashRunner):
    """Always prefers token ``favorite`` (a model stuck repeating itself)."""

    def __init__(self, favorite: int) -> None:
        super().__init__(num_slots=4096, max_reqs=16)
        self.favorite = favorite

    def forward(self, b) -> torch.Tensor:
        logits = super().forward(b)
        logits[:, self.favorite] += 100.0
        return logits


def test_repetition_guard_ends_a_runaway_string(backend, tokenizer):
    favorite = tokenizer.encode("ha", add_special_tokens=False)[0]
    schema = {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}
    reqs = [({"json_schema": json.dumps(schema)}, 400)]
    config = CompletionConfig(repetition_window=16)
    (res,), manager = _run(backend, tokenizer, config, reqs, runner=OneTokenRunner(favorite))
    assert res["finish"]["type"] == "stop" and len(res["ids"]) < 60
    value = json.loads(tokenizer.decode(res["ids"][:-1]))
    assert set(value["s"]) <= set("ha") and len(value["s"]) >= 16  # the model's own text kept
    assert manager.completion.repetitions == 1


def test_config_is_validated():
    with pytest.raises(InvalidRequestError) as e:
        CompletionConfig(slack_tokens=-1)
    assert e.value.field == "grammar_completion_slack"


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("head,chunk,runaway", [
    ('{"regions": ["golang-', "jenkins-xxx-minimal-", True),  # inside one string
    ('{"n": 1', "2345678", True),  # inside one number
    ('{"from": 1, "bodyParts": [', '{"bodyParts": [', True),  # nesting deeper each time
    ("la la la, ", "the cat sat down, ", True),  # not JSON: the whole output is one value
    ('{"regions": [', '"golang-xp-open-v1", ', False),  # an array of equal items
    ('[{"a": 1, "b": "xy"}, ', '{"a": 1, "b": "x"}, ', False),
])
def test_long_periods_are_runaway_only_inside_a_value_or_nesting(tokenizer, head, chunk,
                                                                 runaway):
    from sgdsl.runtime.grammar.forcing.runaway import SHORT_PERIOD, is_runaway, period

    ids = _ids(tokenizer, head) + _ids(tokenizer, chunk) * 12  # as a model repeats tokens
    assert SHORT_PERIOD < period(ids, 32) <= 16
    assert is_runaway(tokenizer, ids, 32) == runaway
    few = _ids(tokenizer, head) + _ids(tokenizer, chunk) * 2
    assert not period(few, 32) and not is_runaway(tokenizer, few, 32)  # too short to tell


def test_short_periods_are_runaway_anywhere(tokenizer):
    from sgdsl.runtime.grammar.forcing.runaway import is_runaway, period

    ids = _ids(tokenizer, "[" + "0, " * 30)
    assert 1 <= period(ids, 32) <= 4 and is_runaway(tokenizer, ids, 32)
    assert period(ids, 0) == 0


class PreferRunner(HashRunner):
    """A stand-in model with habits: token ``cycle[context length % len(cycle)]`` first, then
    ``prefer`` in order, where the grammar allows them (the hash logits decide the rest);
    ``spacing`` apart in logits (1: the next preference is often sampled instead)."""

    def __init__(self, cycle=(), prefer=(), spacing: float = 10.0) -> None:
        super().__init__(num_slots=4096, max_reqs=16)
        self.cycle, self.prefer, self.spacing = list(cycle), list(prefer), spacing

    def forward(self, b) -> torch.Tensor:
        logits = super().forward(b)
        lens = [b.extend_prefix_lens_cpu[i] + j + 1 for i in range(b.batch_size)
                for j in range(b.extend_seq_lens_cpu[i])]
        if b.logits_indices is not None:
            lens = [lens[k] for k in b.logits_indices.tolist()]
        for row, n in enumerate(lens):
            for rank, tok in enumerate(self.prefer):
                logits[row, tok] += 100.0 - self.spacing * rank
            if self.cycle:
                logits[row, self.cycle[n % len(self.cycle)]] += 200.0
        return logits


def test_repetition_guard_ends_a_long_period_inside_a_string(backend, tokenizer):
    cycle = _ids(tokenizer, "golang-xp-open-saml")  # 11 tokens: over the short period
    schema = {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}
    reqs = [({"json_schema": json.dumps(schema)}, 240)]  # the stand-in's context: 256
    (res,), manager = _run(backend, tokenizer, CompletionConfig(), reqs,
                           runner=PreferRunner(cycle=cycle))
    assert res["finish"]["type"] == "stop" and len(res["ids"]) < 100, len(res["ids"])
    value = json.loads(tokenizer.decode(res["ids"][:-1]))
    assert "golang-xp-open-saml" * 3 in value["s"]
    assert manager.completion.repetitions == 1


def test_repetition_guard_ends_nesting_that_keeps_growing(backends, tokenizer):
    tree = {"type": "object", "required": ["name", "kids"],
            "properties": {"name": {"type": "string"},
                           "kids": {"type": "array", "items": {"$ref": "#"}}}}
    prefer = [_ids(tokenizer, t)[0] for t in ('",', '"', ' [{', '{"', "kids", '":', "[")]
    reqs = [({"json_schema": json.dumps(tree)}, 240)]  # the stand-in's context: 256
    (res,), manager = _run(backends["xgrammar"], tokenizer, CompletionConfig(), reqs,
                           runner=PreferRunner(prefer=prefer))
    text = tokenizer.decode(res["ids"][:-1])
    assert res["finish"]["type"] == "stop" and len(res["ids"]) < 150, text
    assert text.count('"kids"') >= 5 and json.loads(text)
    assert manager.completion.repetitions == 1, text


def test_a_new_array_item_never_outgrows_the_budget(backend, tokenizer):
    """A "," between items raises the need from 2 tokens to a whole item (a date-time is ~20
    of them): the reserve kept beside the need (the largest need seen) still holds it."""
    item = {"type": "object", "required": ["measurement", "timestamp", "value"],
            "properties": {"measurement": {"type": "string"},
                           "timestamp": {"type": "string", "format": "date-time"},
                           "value": {"type": "number"}}}
    schema = {"type": "object", "required": ["data"],
              "properties": {"data": {"type": "array", "items": item}}}
    prefer = [_ids(tokenizer, t)[0] for t in ('"},', "},", ",", ' {"', '{"', '"')]
    budgets = list(range(150, 241, 6))  # the stand-in model's context ends at 256
    reqs = [({"json_schema": json.dumps(schema)}, b) for b in budgets]
    # NOTE: a noisy habit (spacing 1) ends items at varied points: some "," then comes with
    # the budget too short for the next item unless the reserve held it (most were cut before)
    results, _ = _run(backend, tokenizer, CompletionConfig(), reqs,
                      runner=PreferRunner(prefer=prefer, spacing=1.0))
    for budget, res in zip(budgets, results):
        assert res["finish"]["type"] == "stop", (budget, tokenizer.decode(res["ids"]))
        _check_value(reqs[0][0], tokenizer.decode(res["ids"][:-1]))


LONG = [({"json_schema": json.dumps(PERSON)}, 120), ({"json_schema": json.dumps(PERSON)}, 90),
        ({"regex": SENTENCE}, 64), ({"json_schema": '{"type": "object"}'}, 80)]


def test_estimates_in_the_worker_are_deterministic(backend, tokenizer):
    """Estimates far from the budget's end are searched in the estimate worker and taken a
    fixed number of steps later, or searched here when the worker has not answered (still
    starting): both runs give the same outputs, every one complete, as without."""
    cold, _ = _run(backend, tokenizer, CompletionConfig(), LONG)
    warm, manager = _run(backend, tokenizer, CompletionConfig(), LONG, warm=True)
    assert [r["ids"] for r in cold] == [r["ids"] for r in warm]
    for (constraint, budget), res in zip(LONG, warm):
        assert res["finish"]["type"] == "stop" and res["ids"][-1] == EOS
        assert len(res["ids"]) <= budget
        _check_value(constraint, tokenizer.decode(res["ids"][:-1]))
    # xgrammar's searches went to the worker and were answered there; outlines' stay in
    # this process (estimate.py says why)
    jobs = manager.completion.jobs
    assert (jobs.submitted > 0) == (backend.name == "xgrammar"), jobs.submitted
    assert jobs.answered == jobs.submitted, (jobs.answered, jobs.submitted)
    off, _ = _run(backend, tokenizer, CompletionConfig(async_estimates=False), LONG)
    for (constraint, _), res in zip(LONG, off):
        assert res["finish"]["type"] == "stop"
        _check_value(constraint, tokenizer.decode(res["ids"][:-1]))

