"""Token texts: the raw bytes behind each id and the fast decoder the completion tracker uses."""
from __future__ import annotations

import random

from sgdsl.runtime.grammar.vocab import fast_decoder, token_bytes

from .helpers import VOCAB


def test_fast_decoder_matches_decode(tokenizer):
    decode = fast_decoder(tokenizer)
    assert decode is not tokenizer.decode  # the embedded tokenizer takes the fast path
    rng = random.Random(0)
    for _ in range(500):  # split multi-byte characters and special tokens included
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randrange(1, 6))]
        assert decode(ids) == tokenizer.decode(ids), ids


def test_fast_decoder_keeps_clean_up(tokenizer, monkeypatch):
    """A tokenizer that cleans up spaces after decoding keeps its own decode."""
    monkeypatch.setattr(tokenizer, "clean_up_tokenization_spaces", True)
    assert fast_decoder(tokenizer) == tokenizer.decode


def test_token_bytes_spell_the_tokens(tokenizer):
    table = token_bytes(tokenizer, VOCAB)
    for text in ('{"name": "Ada"}', " héllo", "12.5e3"):
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert b"".join(table[i] for i in ids).decode("utf-8") == text
    assert table[tokenizer.eos_token_id] is None  # special tokens have no bytes
