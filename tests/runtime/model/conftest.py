"""Shared, expensive fixtures of the model tests: one runner and one HF reference model of the
embedded SmolLM2, built once per session."""
from __future__ import annotations

import pytest
import torch

from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.model.runner import ModelRunner


@pytest.fixture(scope="session")
def smollm_runner() -> ModelRunner:
    return ModelRunner(EngineConfig(device="cpu", max_total_tokens=2048, max_running_requests=8))


@pytest.fixture(scope="session")
def smollm_hf(smollm_runner):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(str(smollm_runner.model_dir),
                                            dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def smollm_tokenizer(smollm_runner):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm_runner.model_dir))
