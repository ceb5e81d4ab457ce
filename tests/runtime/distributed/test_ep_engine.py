"""Expert parallelism through the Engine (CPU, gloo): a tiny Qwen3-MoE with dummy weights (each
rank draws every expert from the seeded stream and keeps its own) at TP=2 EP=2 gives the TP=1
greedy outputs token for token and logprobs within 1e-4 over test_tp_engine's mixed workload
(chunked prefill, retraction, cache hits, grammar, seeded sampling); every rank passes the
idle invariant. ``--ep-size`` reaches the engine from the server's command line."""
from __future__ import annotations

import json

import pytest

from sgdsl.runtime import Engine

from .mixed_workload import SMALL, assert_same, run_mixed

MOE = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
       "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 49152,
       "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
       "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
       "hidden_act": "silu", "intermediate_size": 128, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
       "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
       "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []}
DUMMY = dict(load_format="dummy", **SMALL)


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory, embedded_dir):
    import shutil

    folder = tmp_path_factory.mktemp("tiny-qwen3-moe")
    (folder / "config.json").write_text(json.dumps(MOE))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                 "special_tokens_map.json"):
        if (embedded_dir / name).exists():
            shutil.copy(embedded_dir / name, folder / name)
    return str(folder)


def test_engine_ep2_equals_tp1(moe_dir):
    with Engine(moe_dir, **DUMMY) as engine:
        ref = run_mixed(engine)
    with Engine(moe_dir, tp_size=2, ep_size=2, **DUMMY) as engine:
        assert len(engine._tm.procs) == 2
        assert_same(run_mixed(engine), ref)


def test_server_takes_ep_size():
    from sgdsl.runtime.server.cli import parse_args

    engine, _ = parse_args(["--model", "m", "--tp-size", "4", "--ep-size", "2"])
    assert (engine.tp_size, engine.ep_size, engine.ep_dispatch) == (4, 2, "auto")
    engine, _ = parse_args(["--model", "m", "--tp-size", "2", "--ep-size", "2", "--ep-dispatch",
                            "all_to_all", "--ep-a2a-min-tokens", "64"])  # the old behaviour
    assert (engine.ep_dispatch, engine.ep_a2a_min_tokens) == ("all_to_all", 64)
