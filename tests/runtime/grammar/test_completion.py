"""Forced completion (runtime/grammar/completion.py) through the real Scheduler and
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
from sgdsl.runtime.grammar.completion import CompletionConfig
from sgdsl.runtime.grammar.manager import GrammarManager
from sgdsl.runtime.ipc import messages as m
from sgdsl.runtime.sampling_params import SamplingParams
from sgdsl.runtime.scheduler.scheduler import Scheduler

from .helpers import EOS, VOCAB, shared_compiler
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
         runner=None) -> tuple[list, GrammarManager]:
    manager = GrammarManager(backend, tokenizer, VOCAB, [EOS], completion=completion,
                             compiler=shared_compiler(backend))
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
