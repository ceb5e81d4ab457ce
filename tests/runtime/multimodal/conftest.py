"""Shared tiny vision-language models and one Engine on the Qwen2.5-VL for the session (an
engine start costs seconds on the 2-core box)."""
from __future__ import annotations

from pathlib import Path

import pytest

from .tiny_vlm import tiny_qwen2_5_vl

# NOTE: a 6-token prefill budget cuts the 8-token images of the tests across chunks.
CHUNK = 6


@pytest.fixture(scope="session")
def qwen_vl(tmp_path_factory, tokenizer_dir) -> tuple[Path, object]:
    """(directory, HF model) of the tiny Qwen2.5-VL."""
    folder = tmp_path_factory.mktemp("tiny-qwen2.5-vl")
    return folder, tiny_qwen2_5_vl(folder, tokenizer_dir)


@pytest.fixture(scope="session")
def vl_engine(qwen_vl):
    from sgdsl.runtime import Engine

    # no grammar backend: no test here sends a grammar (``select`` scores choices by
    # logprobs), and its compile and estimate workers are three processes that import torch
    engine = Engine(str(qwen_vl[0]), max_total_tokens=2048, num_threads=1,
                    chunked_prefill_size=CHUNK, grammar_backend="none")
    yield engine
    engine.shutdown()


@pytest.fixture
def vl(vl_engine):
    yield vl_engine
    vl_engine.check_idle_integrity()
