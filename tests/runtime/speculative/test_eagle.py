"""EAGLE / EAGLE3 drafters on a tiny random Llama target: heads in the published checkpoint
layouts load, the target's hidden states are captured per KV slot, and the drafters propose
valid top-k trees, the same whether their head KV was kept from the last step or built anew."""
from __future__ import annotations

import json

import pytest

from .eagle_heads import D2T_STEP, write_head

STEPS, TOPK, TOKENS = 3, 2, 5
PROMPT = list(range(5, 25))


@pytest.fixture(scope="module")
def dirs(tmp_path_factory, tiny_model_dir):
    """The tiny target (4 layers: EAGLE3 reads three of them) and both heads."""
    import shutil

    root = tmp_path_factory.mktemp("eagle")
    base = json.loads((tiny_model_dir / "config.json").read_text())
    target = root / "target"
    shutil.copytree(tiny_model_dir, target)
    (target / "config.json").write_text(json.dumps(dict(base, num_hidden_layers=4)))
    return {"target": target, "EAGLE": write_head(root / "eagle", base, eagle3=False),
            "EAGLE3": write_head(root / "eagle3", base, eagle3=True)}


def _config(dirs, algo: str, **kw):
    from sgdsl.runtime.config import EngineConfig

    # NOTE: on the CPU wherever it runs (the capture check compares fp32 logits exactly)
    return EngineConfig(model=str(dirs["target"]), device="cpu", num_threads=1,
                        max_running_requests=4, max_total_tokens=1024, speculative_algorithm=algo,
                        speculative_draft_model_path=str(dirs[algo]), speculative_num_steps=STEPS,
                        speculative_eagle_topk=TOPK, speculative_num_draft_tokens=TOKENS,
                        speculative_min_speedup=0, **kw)


def _target(config):
    """The target's runner (dummy weights) with one prefilled request: (runner, req)."""
    from sgdsl.runtime.model.runner import ModelRunner
    from sgdsl.runtime.sampling_params import SamplingParams
    from sgdsl.runtime.scheduler.req import Req

    runner = ModelRunner(config.replace(load_format="dummy", speculative_algorithm=None,
                                        speculative_draft_model_path=None))
    req = Req("a", PROMPT, SamplingParams(temperature=0))
    req.req_pool_idx = runner.req_to_token_pool.alloc()
    return runner, req


def _prefill(runner, req, ids):
    """The target forward over every id but the last (a decode step's state): logits."""
    from sgdsl.runtime.speculative.draft_batch import Feed, build_batch

    slots = runner.token_kv_pool.alloc(len(ids) - 1)
    runner.req_to_token_pool.req_to_token[req.req_pool_idx, :len(ids) - 1] = slots
    batch = build_batch([Feed(req.req_pool_idx, 0, ids[:-1], slots)], runner.device, all_rows=True)
    return runner.forward(batch), slots


@pytest.mark.parametrize("algo", ["EAGLE", "EAGLE3"])
def test_heads_draft_valid_trees(dirs, algo):
    from sgdsl.runtime.speculative.eagle import EagleDrafter

    config = _config(dirs, algo)
    runner, req = _target(config)
    drafter = EagleDrafter(config, runner)
    logits, slots = _prefill(runner, req, PROMPT)
    tree = drafter.propose([req], TOKENS)[0]
    assert 0 < len(tree) <= TOKENS and tree.depth <= STEPS
    assert len(tree.children(-1)) <= TOPK
    assert all(0 <= t < 49152 for t in tree.tokens)
    if algo == "EAGLE3":  # draft ids mapped through d2t
        assert all(t % (D2T_STEP + 1) == 0 for t in tree.tokens)
    else:  # the capture holds the final hidden states: the target's logits come back
        import torch

        again = runner.model.compute_logits(drafter.capture.read(slots))
        assert torch.allclose(again, logits, atol=1e-5)
    # the next step: the target accepted one draft and added a token
    req.output_ids = [tree.tokens[0], 7]
    _prefill(runner, req, req.all_ids)  # (recomputes the prompt too: same states)
    kept = drafter.propose([req], TOKENS)[0]
    drafter.release("a")
    assert drafter.check_idle() == []
    fresh = drafter.propose([req], TOKENS)[0]  # the head's KV built from scratch
    assert fresh == kept
    drafter.release("a")
    assert drafter.check_idle() == []


def test_missing_weights_are_named(dirs, tmp_path):
    import shutil

    from sgdsl.runtime.errors import ModelLoadError
    from sgdsl.runtime.speculative.eagle import EagleDrafter

    broken = tmp_path / "broken"
    shutil.copytree(dirs["EAGLE3"], broken)
    from safetensors.torch import load_file, save_file

    weights = load_file(str(broken / "model.safetensors"))
    del weights["d2t"], weights["midlayer.hidden_norm.weight"]
    save_file(weights, str(broken / "model.safetensors"))
    config = _config(dirs, "EAGLE3").replace(speculative_draft_model_path=str(broken))
    runner, _ = _target(config)
    with pytest.raises(ModelLoadError, match="hidden_norm"):
        EagleDrafter(config, runner)


def test_capture_points():
    from sgdsl.runtime.speculative.eagle_head_loader import head_capture_points
    from sgdsl.runtime.speculative.hidden_capture import FINAL

    assert head_capture_points({}, False, 32) == (FINAL,)
    assert head_capture_points({}, True, 32) == (2, 16, 29)  # SGLang's default
    assert head_capture_points({}, True, 4) == (2, 2, 1)
    named = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 15, 28]}}
    assert head_capture_points(named, True, 32) == (2, 16, 29)
