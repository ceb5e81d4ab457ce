"""``StreamLogprobs`` reads both ways a server streams output logprobs: each chunk its own
entries (this runtime; SGLang with --incremental-streaming-output) or all so far (SGLang's
default), told apart by ``output_token_logprobs_length``."""
from __future__ import annotations

import pytest

from sgdsl.backends.stream_logprobs import StreamLogprobs

ENTRIES = [[-0.1 * i, 10 + i, None] for i in range(5)]


def _chunks(cumulative: bool) -> list[dict]:
    """Entries 0-1, 2 (a chunk with no text), 3, then the finish with 4."""
    cuts = [(0, 2), (2, 3), (3, 4), (4, 5)]
    return [{"output_token_logprobs": ENTRIES[0 if cumulative else a:b],
             "output_top_logprobs": [[e] for e in ENTRIES[0 if cumulative else a:b]],
             "output_token_logprobs_length": b, "completion_tokens": b} for a, b in cuts]


@pytest.mark.parametrize("cumulative", [False, True])
def test_chunks_get_their_own_entries_and_the_end_all(cumulative: bool) -> None:
    lp = StreamLogprobs()
    first, textless, third, last = _chunks(cumulative)
    assert lp.chunk_meta(first)["output_token_logprobs"] == ENTRIES[0:2]
    lp.add(textless)  # passed over: its entry goes with the next chunk handed out
    third_meta = lp.chunk_meta(third)
    assert third_meta["output_token_logprobs"] == ENTRIES[2:4]
    assert third_meta["output_top_logprobs"] == [[e] for e in ENTRIES[2:4]]
    assert third_meta["output_token_logprobs_length"] == 4
    full = lp.complete(last)
    assert full["output_token_logprobs"] == ENTRIES
    assert full["output_top_logprobs"] == [[e] for e in ENTRIES]
    assert full["output_token_logprobs_length"] == 5 and full["completion_tokens"] == 5


def test_meta_without_logprobs_passes_through() -> None:
    lp = StreamLogprobs()
    assert lp.chunk_meta({"completion_tokens": 1}) == {"completion_tokens": 1}
    assert lp.complete({"completion_tokens": 2}) == {"completion_tokens": 2}
