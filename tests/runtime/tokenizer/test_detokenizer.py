"""Incremental detokenizer tests on the embedded model's tokenizer: deltas never carry a broken
UTF-8 character, their concatenation equals a full decode, and each step decodes a small window."""
from __future__ import annotations

import random

import pytest

from sgdsl.runtime.tokenizer.detokenizer import IncrementalDetokenizer

from .conftest import CountingTokenizer

TEXTS = [
    "Hello, world! This is plain ASCII text.",
    "Emoji: 😀👍🏽 and flags 🇫🇷 then text.",
    "中文测试：世界你好。日本語のテキスト、한국어 텍스트",
    "Mixed 😀中 a😀b 世😀界 end",
]


def stream(tokenizer, ids, chunk=1, **kw) -> tuple[list[str], IncrementalDetokenizer]:
    detok = IncrementalDetokenizer(tokenizer, **kw)
    deltas = [detok.add(ids[i:i + chunk]) for i in range(0, len(ids), chunk)]
    deltas.append(detok.flush())
    return deltas, detok


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_are_whole_characters_and_sum_to_decode(tokenizer, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids) or text.isascii()
    deltas, detok = stream(tokenizer, ids)
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == detok.text == tokenizer.decode(ids) == text


def test_multi_token_chunks(tokenizer) -> None:
    ids = tokenizer.encode(TEXTS[3], add_special_tokens=False)
    for chunk in (2, 3, 5):
        deltas, _ = stream(tokenizer, ids, chunk=chunk)
        assert "".join(deltas) == TEXTS[3] and all("\ufffd" not in d for d in deltas)


def test_special_tokens_skipped_or_kept(tokenizer) -> None:
    ids = tokenizer.encode("Hi there", add_special_tokens=False) + [2] + tokenizer.encode(
        " more 😀", add_special_tokens=False)
    for skip in (True, False):
        deltas, _ = stream(tokenizer, ids, skip_special_tokens=skip)
        assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=skip)
    assert "<|im_end|>" in "".join(stream(tokenizer, ids, skip_special_tokens=False)[0])


def test_incomplete_character_at_end_is_held_until_flush(tokenizer) -> None:
    ids = tokenizer.encode("ok 😀", add_special_tokens=False)[:-1]  # cut inside the emoji
    detok = IncrementalDetokenizer(tokenizer)
    streamed = "".join(detok.add([i]) for i in ids)
    assert streamed == "ok" or streamed == "ok "
    assert "\ufffd" not in streamed
    rest = detok.flush()
    assert streamed + rest == tokenizer.decode(ids) and rest.endswith("\ufffd")
    assert detok.flush() == ""


def test_window_stays_small_on_long_output(tokenizer) -> None:
    text = " ".join(TEXTS) * 6
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) > 150
    counting = CountingTokenizer(tokenizer)
    deltas, _ = stream(counting, ids)
    assert "".join(deltas) == text
    # A window covers at most one multi-token character (a flag emoji is 8 byte tokens) plus
    # the previous emission: never the whole output.
    assert max(counting.lengths) <= 12


def test_random_token_streams_match_full_decode(tokenizer) -> None:
    rng = random.Random(0)
    # Single-byte tokens sit at the start of the vocabulary; they make invalid UTF-8 mid-stream.
    byte_tokens = [i for i in range(600) if tokenizer.decode([i]) == "\ufffd"]
    assert len(byte_tokens) > 50
    for _ in range(20):
        ids = [rng.choice(byte_tokens) if rng.random() < 0.5 else rng.randrange(3, 49152)
               for _ in range(rng.randint(1, 30))]
        for skip in (True, False):
            deltas, _ = stream(tokenizer, ids, skip_special_tokens=skip)
            assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("skip", [True, False])
def test_direct_backend_decode_equals_the_tokenizers_decode(tokenizer, skip: bool) -> None:
    """The stream path decodes through the fast tokenizer's backend (``ids_decoder``): the same
    text as ``tokenizer.decode``, special tokens and broken UTF-8 included."""
    from sgdsl.runtime.tokenizer.detokenizer import ids_decoder

    assert tokenizer.is_fast and tokenizer.clean_up_tokenization_spaces is False
    decode = ids_decoder(tokenizer, skip_special_tokens=skip)
    rng = random.Random(7)
    texts = [tokenizer.encode(t, add_special_tokens=False) for t in TEXTS]
    for _ in range(300):
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randrange(1, 12))]
        ids += rng.choice(texts)[:rng.randrange(0, 6)] + [rng.randrange(0, 17)]
        assert decode(ids) == tokenizer.decode(ids, skip_special_tokens=skip), ids


class _WrapperCounted:
    """A tokenizer whose HF ``decode`` wrapper counts its calls (everything else delegated)."""

    def __init__(self, inner) -> None:
        self.inner, self.calls = inner, 0

    def decode(self, ids, **kw):
        self.calls += 1
        return self.inner.decode(ids, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.parametrize("skip", [True, False])
def test_final_text_decodes_through_the_backend(tokenizer, skip: bool) -> None:
    """A finished request's text (``ReqState.final_text``, every non-streamed answer) is the
    tokenizer's decode, built by the fast backend without HF's per-id wrapper (issue 29: the
    answers of a burst's last step are built one after another)."""
    from sgdsl.runtime.ipc.messages import ReqOut
    from sgdsl.runtime.sampling_params import SamplingParams
    from sgdsl.runtime.tokenizer.req_state import ReqState

    counted = _WrapperCounted(tokenizer)
    rng = random.Random(11)
    for i in range(100):
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randrange(1, 20))]
        stop = ids[-1] if i % 3 == 0 else None  # a matched stop token is trimmed
        state = ReqState(f"r{i}", SamplingParams(skip_special_tokens=skip), counted)
        state.apply(ReqOut(f"r{i}", ids, {"type": "stop", "matched": stop} if stop is not None
                           else {"type": "length", "length": len(ids)}))
        want = ids[:-1] if stop is not None else ids
        assert state.final_text() == tokenizer.decode(want, skip_special_tokens=skip), ids
    assert counted.calls == 0
