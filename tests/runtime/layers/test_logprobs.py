"""Logprob tests: values equal log-softmax of raw logits, top-k order, prompt logprobs from a start
index (position 0 is None), chunked prefill concatenation, and the text attachment."""
from __future__ import annotations

import math

import torch

from sgdsl.runtime.layers.logprobs import (attach_text, output_logprobs, prompt_logprobs,
                                           top_logprobs)

torch.manual_seed(0)
LOGITS = torch.randn(7, 11) * 3
IDS = [4, 9, 1, 0, 10, 3, 3]


def ref_lp(row: int, tok: int) -> float:
    return float(LOGITS[row].double().exp().div(LOGITS[row].double().exp().sum()).log()[tok])


def test_output_logprobs_values_and_top_k() -> None:
    chosen, tops = output_logprobs(LOGITS[:3], torch.tensor([2, 5, 7]), [0, 3, 1])
    assert [c[1] for c in chosen] == [2, 5, 7]
    for row, (lp, tok, text) in enumerate(chosen):
        assert math.isclose(lp, ref_lp(row, tok), abs_tol=1e-5) and text is None
    assert tops[0] == []
    assert [t[1] for t in tops[1]] == LOGITS[1].topk(3).indices.tolist()
    assert tops[1][0][0] >= tops[1][1][0] >= tops[1][2][0]
    assert len(tops[2]) == 1 and tops[2][0][1] == int(LOGITS[2].argmax())
    assert all(isinstance(x, float) for x in (tops[1][0][0], chosen[0][0]))


def test_top_logprobs_all_zero() -> None:
    assert top_logprobs(torch.log_softmax(LOGITS, -1), [0, 0]) == [[], []]


def test_prompt_logprobs_from_zero_starts_with_none() -> None:
    tokens, tops = prompt_logprobs(LOGITS, IDS, start_len=0, top_num=2)
    assert len(tokens) == len(IDS) and tokens[0] == [None, IDS[0], None] and tops[0] is None
    for j in range(1, len(IDS)):
        assert tokens[j][1] == IDS[j]
        assert math.isclose(tokens[j][0], ref_lp(j - 1, IDS[j]), abs_tol=1e-5)
        assert len(tops[j]) == 2 and tops[j][0][1] == int(LOGITS[j - 1].argmax())


def test_prompt_logprobs_from_start_index() -> None:
    tokens, tops = prompt_logprobs(LOGITS, IDS, start_len=4)
    assert [t[1] for t in tokens] == IDS[4:]
    assert math.isclose(tokens[0][0], ref_lp(3, IDS[4]), abs_tol=1e-5)
    assert tops == [[], [], []]


def test_chunked_prompt_logprobs_concatenate_to_unchunked() -> None:
    whole = prompt_logprobs(LOGITS, IDS, start_len=2, top_num=1)
    parts: tuple[list, list] = ([], [])
    for lo, hi in ((0, 3), (3, 5), (5, 7)):  # three prefill chunks
        t, p = prompt_logprobs(LOGITS[lo:hi], IDS, start_len=2, first_row_pos=lo, top_num=1)
        parts[0].extend(t)
        parts[1].extend(p)
    assert parts[0] == whole[0] and parts[1] == whole[1]


def test_prompt_logprobs_chunk_after_cached_prefix() -> None:
    # Prefix 0..4 cached: only rows 5, 6 computed; start beyond them reports nothing but token 6.
    tokens, _ = prompt_logprobs(LOGITS[5:], IDS, start_len=6, first_row_pos=5)
    assert [t[1] for t in tokens] == [IDS[6]]
    assert math.isclose(tokens[0][0], ref_lp(5, IDS[6]), abs_tol=1e-5)


def test_single_token_prompt() -> None:
    assert prompt_logprobs(LOGITS[:1], [7], start_len=0) == ([[None, 7, None]], [None])


def test_attach_text_nested() -> None:
    tokens, tops = prompt_logprobs(LOGITS, IDS, start_len=0, top_num=2)
    named = attach_text(tokens, lambda t: f"<{t}>")
    assert named[0] == [None, IDS[0], f"<{IDS[0]}>"] and named[1][2] == f"<{IDS[1]}>"
    named_tops = attach_text(tops, lambda t: str(t))
    assert named_tops[0] is None and named_tops[1][0][2] == str(tops[1][0][1])
    assert tokens[1][2] is None  # the input is not modified
