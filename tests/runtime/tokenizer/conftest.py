"""Shared fixture: the embedded model's tokenizer (byte-level BPE), loaded once per session;
and ``CountingTokenizer``, which records how many ids each decode call gets."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    from sgdsl.runtime.model.embedded import embedded_model_path

    return AutoTokenizer.from_pretrained(str(embedded_model_path()))


class CountingTokenizer:
    """Wraps a tokenizer and records the length of every decode call."""

    def __init__(self, inner) -> None:
        self.inner, self.lengths = inner, []

    def decode(self, ids, **kw):
        self.lengths.append(len(ids))
        return self.inner.decode(ids, **kw)
