"""A fully stated Llama config.json is read as plain JSON (runtime/model/plain_config.py, no
transformers config import on an engine's start): the same ``ModelConfig`` as transformers'
``AutoConfig`` gives for it, and anything the file leaves to transformers still goes there."""
from __future__ import annotations

import json

import pytest

from sgdsl.runtime.model.embedded import embedded_model_path
from sgdsl.runtime.model.model_config import ModelConfig
from sgdsl.runtime.model.plain_config import plain_llama

def _without(cfg: dict, *keys: str) -> dict:
    return {k: v for k, v in cfg.items() if k not in keys}


def _plain(tiny: dict) -> dict:
    """Files that state everything (the tests' tiny model and variants of it)."""
    return {
        "embedded": json.loads((embedded_model_path() / "config.json").read_text()),
        "tiny": tiny,
        "no_arch_no_head_dim": _without(tiny, "architectures", "head_dim"),
        "eos_list_bias_bf16": {**tiny, "eos_token_id": [2, 7], "attention_bias": True,
                               "torch_dtype": "bfloat16", "tie_word_embeddings": False},
        "rope_parameters": {**_without(tiny, "rope_theta"),
                            "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}},
    }


def _deferred(tiny: dict) -> dict:
    return {
        "rope_scaling": {**tiny, "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
        "scaled_rope_parameters": {**_without(tiny, "rope_theta"), "rope_parameters": {
            "rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}},
        "no_eos": _without(tiny, "eos_token_id"),
        "no_rope_theta": _without(tiny, "rope_theta"),
        "no_kv_heads": _without(tiny, "num_key_value_heads"),
        "quantized": {**tiny, "quantization_config": {"quant_method": "fp8"}},
        "mistral": {**tiny, "model_type": "mistral", "architectures": ["MistralForCausalLM"]},
        "string_size": {**tiny, "hidden_size": "64"},
        "bool_eps": {**tiny, "rms_norm_eps": True},
    }


PLAIN_NAMES = ("embedded", "tiny", "no_arch_no_head_dim", "eos_list_bias_bf16", "rope_parameters")
DEFERRED_NAMES = ("rope_scaling", "scaled_rope_parameters", "no_eos", "no_rope_theta",
                  "no_kv_heads", "quantized", "mistral", "string_size", "bool_eps")


@pytest.fixture
def tiny(tiny_model_dir) -> dict:
    return json.loads((tiny_model_dir / "config.json").read_text())


def _write(path, cfg):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize("name", PLAIN_NAMES)
def test_plain_read_equals_autoconfig(tmp_path, tiny, name):
    from transformers import AutoConfig

    cfg = _plain(tiny)[name]
    folder = _write(tmp_path, cfg)
    assert plain_llama(cfg) is not None  # this file takes the plain path
    via_hf = ModelConfig.from_hf(AutoConfig.from_pretrained(str(folder)), "LlamaForCausalLM")
    assert ModelConfig.from_dir(folder) == via_hf
    assert ModelConfig.from_dir(folder).torch_dtype == via_hf.torch_dtype


@pytest.mark.parametrize("name", DEFERRED_NAMES)
def test_anything_not_stated_goes_to_autoconfig(tiny, name):
    assert plain_llama(_deferred(tiny)[name]) is None


def test_deferred_file_still_reads_through_transformers(tmp_path, tiny):
    cfg = _deferred(tiny)["rope_scaling"]
    c = ModelConfig.from_dir(_write(tmp_path, cfg))
    assert c.rope_scaling.rope_type == "linear" and c.rope_scaling.factor == 2.0
