"""Shared fixture: the embedded model's tokenizer (byte-level BPE), loaded once per session."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    from sgdsl.runtime.model.embedded import embedded_model_path

    return AutoTokenizer.from_pretrained(str(embedded_model_path()))
