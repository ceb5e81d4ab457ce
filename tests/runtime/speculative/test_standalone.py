"""STANDALONE drafter: the embedded SmolLM2 drafting for itself (draft path = its GGUF file)
proposes exactly the target's greedy continuation (Hugging Face ``generate`` as the reference),
keeps its draft KV across steps (partial acceptance, rewrites), frees it on release, and
drafts nothing where the context or the pool has no room."""
from __future__ import annotations

import types

import pytest
from greedy import hf_greedy

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "<|im_start|>user\nName three fruits.<|im_end|>\n<|im_start|>assistant\n",
]
MAX_NEW = 16
STEPS = 4


@pytest.fixture(scope="module")
def greedy_reference(embedded_dir):
    """(prompt ids, greedy continuation) per prompt, from transformers."""
    return hf_greedy(embedded_dir, PROMPTS, MAX_NEW, eos_token_id=None)


def _target(context_len: int = 2048, slots: int = 4096):
    """The facts of the target's ModelRunner the drafter reads (the embedded model's)."""
    import torch

    from sgdsl.runtime.model.embedded import embedded_model_path
    from sgdsl.runtime.model.model_config import ModelConfig

    return types.SimpleNamespace(device=torch.device("cpu"), dtype=torch.float32,
                                 context_len=context_len, max_total_tokens=slots,
                                 model_config=ModelConfig.from_dir(embedded_model_path()))


@pytest.fixture(scope="module")
def drafter():
    from sgdsl.runtime.config import EngineConfig
    from sgdsl.runtime.model.embedded import embedded_gguf_path
    from sgdsl.runtime.speculative.standalone import StandaloneDrafter

    config = EngineConfig(num_threads=1, max_running_requests=4, speculative_algorithm="standalone",
                          speculative_draft_model_path=str(embedded_gguf_path()),
                          speculative_num_steps=STEPS)
    d = StandaloneDrafter(config, _target())
    yield d
    assert d.check_idle() == []


def _req(rid: str, ids: list[int]):
    from sgdsl.runtime.sampling_params import SamplingParams
    from sgdsl.runtime.scheduler.req import Req

    return Req(rid, ids, SamplingParams(temperature=0, max_new_tokens=MAX_NEW))


def test_drafts_the_targets_greedy_continuation(drafter, greedy_reference):
    reqs = [_req(f"r{i}", prompt) for i, (prompt, _) in enumerate(greedy_reference)]
    # step through the outputs as a verifier accepting 0..STEPS drafts + 1 token would
    done = [0] * len(reqs)
    for accept in (STEPS, 1, 0, 2, STEPS):
        trees = drafter.propose(reqs, STEPS)
        for i, (req, tree, (_, ref)) in enumerate(zip(reqs, trees, greedy_reference)):
            assert tree.is_chain and len(tree) == STEPS
            assert list(tree.tokens) == ref[done[i]:done[i] + STEPS], (i, done[i])
            take = accept + 1
            req.output_ids.extend(ref[done[i]:done[i] + take])
            done[i] += take
    assert max(done) <= MAX_NEW
    for req in reqs:
        drafter.release(req.rid)
    assert drafter.check_idle() == []


def test_proposal_cost_drafting_for_itself(drafter):
    """The cost gate's prior (cost.py): STEPS forwards of a model as large as the target cost
    at least STEPS target steps, so 1 + STEPS tokens at best cannot beat plain decoding."""
    assert drafter.proposal_cost() == STEPS


def test_rewrite_and_release(drafter, greedy_reference):
    """A rewritten suffix (a jump-forward, or a retracted request coming back) drops the draft
    KV past the common prefix; the drafts follow the new ids."""
    prompt, ref = greedy_reference[0]
    req = _req("w", prompt + ref[:6])
    assert list(drafter.propose([req], STEPS)[0].tokens) == ref[6:6 + STEPS]
    held = len(drafter.kv.entries["w"].ids)
    req.output_ids = []  # back to the prompt alone
    req.origin_input_ids = prompt
    assert list(drafter.propose([req], 2)[0].tokens) == ref[:2]
    assert len(drafter.kv.entries["w"].ids) < held
    drafter.release("w")
    drafter.release("w")  # twice is harmless (finish after abort)
    assert drafter.check_idle() == []


def test_no_room_means_no_draft(drafter, greedy_reference):
    prompt, _ = greedy_reference[0]
    assert len(drafter.propose([_req("z", prompt)], 0)[0]) == 0
    long = _req("long", prompt * (drafter.context_len // len(prompt) + 1))
    assert len(drafter.propose([long], STEPS)[0]) == 0
    assert drafter.check_idle() == []


def test_draft_memory_estimates():
    """The target's KV sizing leaves room for the draft (runner._kv_capacity on CUDA): a
    Llama-3.1-8B drafting for itself reserves its weights and the same KV bytes per slot."""
    from pathlib import Path

    import torch

    from sgdsl.runtime.config import EngineConfig
    from sgdsl.runtime.speculative.draft_memory import DraftMemory

    llama8b = Path(__file__).parents[3] / "benchmarks" / "gpu" / "configs" / "llama-3.1-8b"
    config = EngineConfig(model=str(llama8b), load_format="dummy",
                          speculative_algorithm="STANDALONE",
                          speculative_draft_model_path=str(llama8b))
    need = DraftMemory.of(config, torch.bfloat16)
    assert abs(need.reserve - 2 * 8.03e9) / 16.06e9 < 0.01
    assert need.per_slot == 32 * 2 * 8 * 128 * 2  # layers x (k, v) x kv heads x head dim x bf16
    off = config.replace(speculative_algorithm=None, speculative_draft_model_path=None)
    assert DraftMemory.of(off, torch.bfloat16) == DraftMemory()
