"""The speculative step on the scheduler's deterministic stand-in model (tests/runtime/scheduler):
the stand-in reads every token back from the KV slots, so a wrong column, a rejected node's
slot kept or an accepted one freed changes the output. A scripted drafter proposes the right
continuation with deliberate mistakes; outputs must equal the stand-in's greedy reference, and
the idle invariant holds after each test (KV of rejected tokens freed, rows consistent)."""
from __future__ import annotations

import math

import torch

from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.ipc import messages as m
from sgdsl.runtime.speculative.base import Drafter, DraftTree
from sgdsl.runtime.speculative.decoder import SpecDecoder

from scheduler.conftest import make_harness  # noqa: F401 (the scheduler tests' fixture)
from scheduler.standin import VOCAB, expected, next_token


class ScriptedDrafter(Drafter):
    """Proposes the true continuation of each request, wrong from position ``wrong_at`` on
    (``None``: never wrong); ``branch``: a wrong first child before the right chain (a tree)."""

    def __init__(self, wrong_at: int | None = 2, branch: bool = False) -> None:
        self.wrong_at, self.branch = wrong_at, branch
        self.live: set[str] = set()
        self.released: list[str] = []

    def propose(self, reqs, max_tokens, hidden=None):
        trees = []
        for req in reqs:
            self.live.add(req.rid)
            truth = expected(req.all_ids, max_tokens)
            if self.wrong_at is not None and self.wrong_at < len(truth):
                truth[self.wrong_at] = (truth[self.wrong_at] + 1) % VOCAB
            if not self.branch:
                trees.append(DraftTree.chain(truth))
                continue
            decoy = (truth[0] + 3) % VOCAB  # node 0: a wrong sibling; the chain from node 1
            tokens = (decoy, *truth[:max_tokens - 1])
            parents = (-1, -1, *range(1, len(tokens) - 2 + 1))
            trees.append(DraftTree(tokens, parents[:len(tokens)]))
        return trees

    def release(self, rid):
        self.live.discard(rid)
        self.released.append(rid)

    def check_idle(self):
        return [f"live {sorted(self.live)}"] if self.live else []


class TreeStandIn:
    """Wraps the stand-in runner: a TARGET_VERIFY row reads its prefix and its tree
    ancestors (the tree mask), not the columns before it."""

    def __init__(self, runner) -> None:
        self.inner = runner
        self.req_to_token_pool = runner.req_to_token_pool
        self.token_kv_pool = runner.token_kv_pool
        self.context_len = runner.context_len
        self.forwards = runner.forwards

    def forward(self, b):
        if b.spec_info is None:
            return self.inner.forward(b)
        self.forwards.append(b)
        kv = self.token_kv_pool.k_buffer[0]
        kv[b.out_cache_loc, 0, 0] = b.input_ids.double()
        rows = []
        for i in range(b.batch_size):
            row, p = int(b.req_pool_indices[i]), b.extend_prefix_lens_cpu[i]
            mask = b.spec_info.masks[i]
            for j in range(b.extend_seq_lens_cpu[i]):
                cols = list(range(p)) + [p + c for c in range(mask.shape[1]) if mask[j, c]]
                slots = self.req_to_token_pool.req_to_token[row, cols]
                rows.append(next_token([int(x) for x in kv[slots, 0, 0].tolist()]))
        target = torch.tensor(rows, dtype=torch.int64)
        return -0.5 * (torch.arange(VOCAB).view(1, -1) - target.view(-1, 1)).abs().float()


def _spec(h, drafter: Drafter, k: int = 4, **cfg) -> Drafter:
    cfg.setdefault("speculative_min_speedup", 0)  # the cost gate (cost.py) off: steps counted
    config = EngineConfig(speculative_algorithm="ngram", speculative_num_draft_tokens=k, **cfg)
    h.sched.spec = SpecDecoder(config, h.runner, drafter=drafter)
    return drafter


def test_chain_drafts_match_reference_and_free_rejected_kv(make_harness):
    h = make_harness()
    drafter = _spec(h, ScriptedDrafter(wrong_at=2))
    prompts = {"a": [1, 2, 3, 4, 5], "b": [9, 8], "c": list(range(3, 30))}
    for rid, p in prompts.items():
        h.submit(rid, p, max_new_tokens=11, ignore_eos=True)
    h.run()
    for rid, p in prompts.items():
        assert h.outs[rid] == expected(p, 11), rid
    stats = h.sched.stats()
    assert stats["spec_verify_steps"] > 0
    # 2 right tokens per draft, then a wrong one: 3 tokens per verify row (max_new_tokens aside)
    assert stats["spec_tokens_per_row"] > 2.5
    assert sorted(drafter.released) == ["a", "b", "c"]


def test_tree_drafts_follow_the_right_branch(make_harness):
    h = make_harness()
    h.sched.runner = runner = TreeStandIn(h.runner)
    h.runner = runner
    _spec(h, ScriptedDrafter(wrong_at=None, branch=True), k=5)
    prompts = {"a": [1, 2, 3], "b": [7, 7, 7, 7]}
    for rid, p in prompts.items():
        h.submit(rid, p, max_new_tokens=13, ignore_eos=True)
    h.run()
    for rid, p in prompts.items():
        assert h.outs[rid] == expected(p, 13), rid
    assert any(b.spec_info is not None for b in runner.forwards)
    assert h.sched.stats()["spec_tokens_per_row"] > 3


def test_max_new_tokens_and_stop_token_mid_draft(make_harness):
    h = make_harness()
    _spec(h, ScriptedDrafter(wrong_at=None), k=6)
    prompt = [1, 2, 3, 4]
    ref = expected(prompt, 20)
    stop = ref[5]
    h.submit("len", prompt, max_new_tokens=3, ignore_eos=True)
    h.submit("stop", prompt, max_new_tokens=20, stop_token_ids=[stop], ignore_eos=True)
    h.run()
    assert h.outs["len"] == ref[:3]
    assert h.finish["len"] == {"type": "length", "length": 3}
    assert h.outs["stop"] == ref[:ref.index(stop) + 1]
    assert h.finish["stop"]["type"] == "stop"


def test_retraction_abort_cache_hits_and_chunked_prefill(make_harness):
    # 60 slots for 3 requests of 8 + 24: decode retracts; drafts get only what is left.
    h = make_harness(num_slots=60, ratio=0.0, chunked_prefill_size=16)
    _spec(h, ScriptedDrafter(wrong_at=3))
    prompts = {f"r{i}": [i + 1] * 8 for i in range(3)}
    for rid, p in prompts.items():
        h.submit(rid, p, max_new_tokens=24, ignore_eos=True)
    h.run()
    for rid, p in prompts.items():
        assert h.outs[rid] == expected(p, 24), rid
    long = [(i * 5) % 40 + 1 for i in range(30)]
    h.submit("long", long, max_new_tokens=6, ignore_eos=True)
    h.submit("gone", [5, 6, 7], max_new_tokens=50, ignore_eos=True)
    for _ in range(4):
        h.sched.step()
    h.sched.handle(m.AbortReq("gone", "test abort"))
    h.run()
    assert h.outs["long"] == expected(long, 6)
    assert h.finish["gone"] == {"type": "abort", "message": "test abort"}
    h.submit("hit", long + [3], max_new_tokens=6, ignore_eos=True)  # a cache hit on "long"
    h.run()
    assert h.outs["hit"] == expected(long + [3], 6)


def _ref_logprob(seq: list[int], token: int) -> float:
    logits = -0.5 * (torch.arange(VOCAB) - next_token(seq)).abs().float()
    return float(torch.log_softmax(logits, -1)[token])


def test_logprobs_of_accepted_tokens(make_harness):
    h = make_harness()
    _spec(h, ScriptedDrafter(wrong_at=2))
    prompt = [3, 1, 4, 1, 5]
    h.submit("lp", prompt, max_new_tokens=9, ignore_eos=True, return_logprob=True,
             top_logprobs_num=2)
    h.run()
    out = h.outs["lp"]
    assert out == expected(prompt, 9)
    got = h.last["lp"]["out"]
    assert [t for _, t in got] == out
    for i, (lp, token) in enumerate(got):
        assert math.isclose(lp, _ref_logprob(prompt + out[:i], token), abs_tol=1e-5)


def test_adaptive_batch_limit_and_backoff(make_harness):
    h = make_harness()
    _spec(h, ScriptedDrafter(wrong_at=0), speculative_max_batch_size=2)  # never accepted
    for i in range(3):  # three requests: above the batch limit, no speculation at all
        h.submit(f"b{i}", [i + 2, 5], max_new_tokens=6, ignore_eos=True)
    h.run()
    assert h.sched.stats()["spec_verify_steps"] == 0
    h.submit("solo", [4, 4], max_new_tokens=40, ignore_eos=True)
    h.run()
    assert h.outs["solo"] == expected([4, 4], 40)
    stats = h.sched.stats()
    # nothing is ever accepted: the request backs off and most of its steps are plain
    assert 0 < stats["spec_verify_steps"] < 20 and stats["spec_accepted_tokens"] == 0


class EmptyDrafter(Drafter):
    def propose(self, reqs, max_tokens, hidden=None):
        return [DraftTree() for _ in reqs]


def test_requests_that_never_draft_back_off(make_harness):
    h = make_harness()
    _spec(h, EmptyDrafter())
    h.submit("free", [6, 1, 8], max_new_tokens=80, ignore_eos=True)
    h.run()
    assert h.outs["free"] == expected([6, 1, 8], 80)
    stats = h.sched.stats()
    # each empty proposal costs a synchronous read; the backoff keeps that to a few
    assert stats["spec_verify_steps"] == 0 and stats["spec_empty_proposals"] < 25
    assert stats["spec_skipped_steps"] > 50


class OracleDrafter(Drafter):
    """Proposes the recorded plain output's next tokens (all accepted when the verify step
    samples what plain decoding sampled)."""

    def __init__(self, outputs: dict[str, list[int]]) -> None:
        self.outputs = outputs

    def propose(self, reqs, max_tokens, hidden=None):
        return [DraftTree.chain(self.outputs[r.rid][len(r.output_ids):][:max_tokens])
                for r in reqs]


def test_penalties_and_min_new_tokens_match_plain_decoding(make_harness):
    """Rows with penalties sample with the draft path as output so far (the general sampling
    path, not the greedy shortcut): the same tokens as plain decoding, every draft accepted.
    The stop token becomes allowed (min_new_tokens) exactly at the deepest draft row."""
    prompt = [1, 2, 3, 4]
    ref = expected(prompt, 8)
    params = dict(max_new_tokens=20, stop_token_ids=[ref[5]], min_new_tokens=5,
                  frequency_penalty=0.5, presence_penalty=0.2, ignore_eos=True)
    h = make_harness()
    h.submit("pen", prompt, **params)
    h.run()
    plain = h.outs["pen"]
    assert len(plain) == 6 and plain[-1] == ref[5]
    h = make_harness()
    _spec(h, OracleDrafter({"pen": plain}), k=4)
    h.submit("pen", prompt, **params)
    h.run()
    stats = h.sched.stats()
    assert h.outs["pen"] == plain
    assert stats["spec_verify_steps"] == 1 and stats["spec_accepted_tokens"] == 4
