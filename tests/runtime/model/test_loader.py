"""Loader: model resolution (directory, GGUF file, hub id), weight-file errors, and dummy
weights at a real (Llama-3.1-8B) config, checked structurally on the meta device."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.errors import ModelLoadError
from sgdsl.runtime.model import loader
from sgdsl.runtime.model.llama import LlamaForCausalLM
from sgdsl.runtime.model.loader import load_model, resolve_model_dir
from sgdsl.runtime.model.model_config import ModelConfig

from .test_model_config import LLAMA31_8B, write_config
from .tiny import tiny_model

TINY_LLAMA31 = {**LLAMA31_8B, "hidden_size": 64, "intermediate_size": 128,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "vocab_size": 300, "max_position_embeddings": 512}


def cfg(path, **kw) -> EngineConfig:
    return EngineConfig(model=str(path), device="cpu", **kw)


def test_missing_directory(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_model_dir(cfg(tmp_path / "nope"))


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        resolve_model_dir(cfg(tmp_path))


def test_missing_safetensors_names_directory(tmp_path):
    write_config(tmp_path, TINY_LLAMA31)
    with pytest.raises(ModelLoadError) as err:
        load_model(cfg(tmp_path), "cpu", torch.float32)
    assert str(tmp_path) in str(err.value) and "safetensors" in str(err.value)


def test_missing_shard_named(tmp_path):
    tiny_model("llama", tmp_path, save_kwargs={"max_shard_size": "100KB"})
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 1
    shards[-1].unlink()
    with pytest.raises(ModelLoadError, match=shards[-1].name):
        load_model(cfg(tmp_path), "cpu", torch.float32)


def test_missing_weight_named(tmp_path):
    tiny_model("llama", tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=r"layers\.1\.mlp\.gate_up_proj\.weight:up"):
        load_model(cfg(tmp_path), "cpu", torch.float32)


def test_wrong_shape_named(tmp_path):
    tiny_model("llama", tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    state["model.norm.weight"] = torch.ones(3)
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="model.norm.weight"):
        load_model(cfg(tmp_path), "cpu", torch.float32)


def test_non_gguf_file(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="not a .gguf"):
        resolve_model_dir(cfg(tmp_path / "weights.bin"))


def test_gguf_file_converted_once(tmp_path, monkeypatch):
    monkeypatch.setenv("SGDSL_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 60)
    calls = []

    def fake_convert(src, target):
        calls.append(src)
        write_config(target, TINY_LLAMA31)
        (target / "model.safetensors").write_bytes(b"")

    monkeypatch.setattr(loader, "convert_gguf", fake_convert)
    first = resolve_model_dir(cfg(gguf))
    second = resolve_model_dir(cfg(gguf))
    assert first == second == tmp_path / "cache" / "models" / "m-64"
    assert calls == [gguf]


def test_hub_id_offline_is_clear(tmp_path, monkeypatch):
    import huggingface_hub

    def offline(*args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelLoadError) as err:
        resolve_model_dir(EngineConfig(model="someorg/somemodel"))
    assert "someorg/somemodel" in str(err.value) and "Hugging Face Hub" in str(err.value)


def test_hub_id_uses_snapshot(tmp_path, monkeypatch):
    import huggingface_hub

    write_config(tmp_path / "snap", TINY_LLAMA31)
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda repo, **kw: str(tmp_path / "snap"))
    monkeypatch.chdir(tmp_path)
    assert resolve_model_dir(EngineConfig(model="org/model")) == tmp_path / "snap"


def test_llama31_8b_structure_on_meta(tmp_path):
    mc = ModelConfig.from_dir(write_config(tmp_path, LLAMA31_8B))
    model = LlamaForCausalLM(mc, dtype=torch.bfloat16, device="meta")
    assert sum(p.numel() for p in model.parameters()) == 8_030_261_248
    attn = model.model.layers[0].self_attn
    assert attn.qkv_proj.weight.shape == (4096 + 2 * 1024, 4096)
    assert model.model.layers[0].mlp.gate_up_proj.weight.shape == (2 * 14336, 4096)
    assert model.lm_head.weight.shape == (128256, 4096)


def test_dummy_tiny_llama31(tmp_path):
    write_config(tmp_path, TINY_LLAMA31)  # no weight files at all
    m1, mc = load_model(cfg(tmp_path, load_format="dummy", seed=3), "cpu", torch.float32)
    m2, _ = load_model(cfg(tmp_path, load_format="dummy", seed=3), "cpu", torch.float32)
    assert mc.rope_scaling.rope_type == "llama3" and mc.vocab_size == 300
    w = m1.model.layers[0].self_attn.qkv_proj.weight
    assert torch.equal(w, m2.model.layers[0].self_attn.qkv_proj.weight)
    assert abs(float(w.std()) - 0.02) < 0.005
    assert torch.equal(m1.model.norm.weight, torch.ones(64))
