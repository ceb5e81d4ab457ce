"""Jump-forward for requests that return logprobs: forced tokens are appended without sampling,
and their logprobs come from the rows of the extend that computes their KV, so every output
token has the logprob a plain forward over the same sequence gives it.

The model is a stand-in over the real tokenizer's vocabulary: it reads each sequence back from
the KV pool (token ids stored as KV) and returns a pseudo-random logits row seeded by that
sequence, so a wrong row or a wrong KV slot changes the numbers."""
from __future__ import annotations

import re

import pytest
import torch

from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.grammar.manager import GrammarManager
from sgdsl.runtime.ipc import messages as m
from sgdsl.runtime.sampling_params import SamplingParams
from sgdsl.runtime.scheduler.scheduler import Scheduler

from ..helpers import EOS, VOCAB
from scheduler.standin import StandInRunner

REGEX = r"The answer is (yes|no)\. Thanks for asking, have a nice day!"


def logits_row(seq: list[int]) -> torch.Tensor:
    gen = torch.Generator().manual_seed(hash(tuple(seq)) % (2**31))
    return torch.randn(VOCAB, generator=gen) * 3


class HashRunner(StandInRunner):
    """The scheduler tests' stand-in with ``logits_row`` for its rows."""

    def __init__(self, num_slots: int = 1024, max_reqs: int = 8, context_len: int = 256) -> None:
        super().__init__(num_slots=num_slots, max_reqs=max_reqs, context_len=context_len)

    def logits(self, seqs: list[list[int]]) -> torch.Tensor:
        return torch.stack([logits_row(seq) for seq in seqs])


@pytest.fixture()
def run(backends, compilers, tokenizer):
    def go(prompt: str, max_new_tokens: int, overlap: bool) -> tuple:
        manager = GrammarManager(backends["xgrammar"], tokenizer, VOCAB, [EOS],
                                 compiler=compilers["xgrammar"])
        outs: dict = {"ids": [], "lps": [], "finish": None, "forced": []}

        def send(msg) -> None:
            for o in msg.outs:
                outs["ids"] += o.new_ids
                outs["lps"] += o.output_token_logprobs or []
                outs["forced"] += o.forced_positions or []
                outs["finish"] = o.finish_reason or outs["finish"]
        config = EngineConfig(max_running_requests=8, disable_overlap_schedule=not overlap)
        sched = Scheduler(HashRunner(), config, [EOS], lambda ids: tokenizer.decode(ids), send,
                          grammar=manager)
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, regex=REGEX)
        sched.handle(m.TokenizedGenerateReq("r", ids, params, return_logprob=True,
                                            stream=True))
        for _ in range(500):
            if not sched.step():
                break
        manager.shutdown()
        assert sched._integrity_resp(0).ok
        return ids, outs, outs["finish"], manager
    return go


def _check_logprobs(prompt_ids: list[int], out_ids: list[int], entries: list) -> None:
    assert [t for _, t in entries] == out_ids  # one entry per output token, in order
    for i, (logprob, token) in enumerate(entries):
        ref = torch.log_softmax(logits_row(prompt_ids + out_ids[:i]), dim=-1)[token]
        assert abs(logprob - float(ref)) < 1e-4, (i, token, logprob, float(ref))


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_forced_tokens_get_their_logprobs(run, tokenizer, overlap):
    prompt_ids, outs, finish, manager = run("Question: is it? ", 64, overlap)
    text = tokenizer.decode([t for t in outs["ids"] if t != EOS])
    assert re.fullmatch(REGEX, text), text
    assert finish["type"] == "stop" and outs["ids"][-1] == EOS
    assert manager.stats.jump_forward_tokens >= 5  # most of the text was forced, not sampled
    _check_logprobs(prompt_ids, outs["ids"], outs["lps"])


def test_jump_that_would_end_the_request_is_sampled_instead(run, tokenizer):
    prompt_ids, outs, finish, manager = run("Question: is it? ", 3, False)
    assert finish["type"] == "length" and len(outs["ids"]) == 3
    text = tokenizer.decode(outs["ids"])
    assert "The answer is yes".startswith(text) or "The answer is no".startswith(text), text
    assert manager.stats.jump_forward_tokens == 0  # each jump would have used the budget up
    _check_logprobs(prompt_ids, outs["ids"], outs["lps"])


@pytest.mark.parametrize("overlap", [False, True])
def test_forced_positions_reported(run, tokenizer, overlap):
    """The output positions the grammar filled (jump-forward) are reported; the model sampled
    only where the regex left a choice (yes/no) and its stop token (it returns logprobs)."""
    _, outs, finish, _ = run("Q: is the sky blue?\nA:", 64, overlap)
    ids, forced = outs["ids"], outs["forced"]
    assert finish["type"] == "stop" and forced == sorted(set(forced))
    assert forced and forced[-1] < len(ids) and ids[-1] == EOS
    sampled = [tokenizer.decode([ids[i]]) for i in range(len(ids)) if i not in set(forced)]
    assert 2 <= len(sampled) <= 4 and any(w in "".join(sampled) for w in ("yes", "no")), sampled
    text = tokenizer.decode([ids[i] for i in forced if ids[i] != EOS])
    assert "Thanks for asking, have a nice day!" in text
