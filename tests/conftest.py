"""Shared fixtures for the whole suite.

- ``tiny_model_dir``: a Llama config small enough to run anywhere (2 layers, hidden 64) with the
  embedded model's tokenizer files; load it with ``load_format="dummy"`` (random weights).
- ``tiny_engine``: one Engine on that model for the session (starting one costs seconds).
- ``engine``: ``tiny_engine`` plus the idle invariant asserted after the test.
- ``embedded_engine``: one Engine on the embedded SmolLM2 for the session.
- ``outlines_engine``: one Engine on the embedded SmolLM2 behind outlines for the session.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

# NOTE: without a GPU, Triton kernels run under Triton's interpreter, which must be chosen before
# anything imports triton: ``triton.jit`` decides at decoration, for triton.language's own jit'd
# helpers (``tl.cdiv``, ...) too, when ``triton.language`` is first imported. Setting it in
# tests/runtime/kernels/conftest.py alone was too late once a test module collected before that
# folder imported triton (hicache/test_kv_move.py): every kernel test calling ``tl.cdiv`` then
# failed with "Cannot call @triton.jit'd outside of the scope of a kernel". (A driver check, not
# torch: this file stays torch-free.)
if not os.path.exists("/proc/driver/nvidia/version"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 49152,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "special_tokens_map.json")


@pytest.fixture(scope="session", autouse=True)
def grammar_cache_dir(tmp_path_factory) -> Path:
    """Engines keep compiled grammars on disk (runtime/grammar/compile/disk_cache.py). In the suite the
    default folder is off, so no test sees another's compiles (nor writes outlines indexes of
    tens of MB for nothing); the cache's own tests name a folder (``grammar_cache_dir``), which
    turns it on for their engines. The default folder points into the session's temporary
    folder anyway, never the user's ~/.cache."""
    # runtime.grammar.compile.disk_cache.ENV_DIR / ENV_SWITCH (not imported: torch-free here)
    env = {"SGDSL_GRAMMAR_CACHE_DIR": str(tmp_path_factory.mktemp("grammar-cache")),
           "SGDSL_GRAMMAR_DISK_CACHE": "0"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield Path(env["SGDSL_GRAMMAR_CACHE_DIR"])
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def embedded_dir() -> Path:
    from sgdsl.runtime.model.embedded import embedded_model_path

    return embedded_model_path()


@pytest.fixture(scope="session")
def tokenizer_dir() -> Path:
    """The embedded model's tokenizer files. Where the embedded model is not installed (the GPU
    machine, which cannot receive its GGUF) the same SmolLM2 tokenizer committed for the GPU
    benchmarks, so the tiny-model GPU tests run there too."""
    from sgdsl.runtime.errors import ModelLoadError
    from sgdsl.runtime.model.embedded import embedded_model_path

    try:
        return embedded_model_path()
    except ModelLoadError:
        return Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "tokenizer"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer_dir) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llama")
    (folder / "config.json").write_text(json.dumps(TINY_CONFIG))
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, folder / name)
    return folder


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_dir):
    from sgdsl.runtime import Engine

    engine = Engine(str(tiny_model_dir), load_format="dummy", max_total_tokens=4096,
                    max_running_requests=32, num_threads=1)
    yield engine
    engine.shutdown()


@pytest.fixture
def engine(tiny_engine):
    yield tiny_engine
    tiny_engine.check_idle_integrity()


@pytest.fixture(scope="session")
def embedded_engine():
    from sgdsl.runtime import Engine

    engine = Engine()
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def outlines_engine():
    """The embedded model behind outlines, once for the suite: the grammar tests' ``json_engine``
    and the e2e validity suite share it (each start of a default-size engine with its compile
    workers is ~20-40 s of the 2-core CI box). Its settings are what both need: a compile
    deadline of 120 s (outlines' slowest compiles on a loaded box), and no wait for a worker
    refused (the validity suite sends ~280 distinct compiles at once: a test of validity, not
    of overload)."""
    from sgdsl.runtime import Engine

    engine = Engine(grammar_backend="outlines", grammar_compile_timeout_s=120.0,
                    grammar_compile_max_wait_s=3600.0)
    yield engine
    engine.shutdown()
