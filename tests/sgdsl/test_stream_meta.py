"""A streaming gen's meta_info: chunks' logprob entries are merged as they arrive and each
read of ``text_async_iter(name, return_meta_data=True)`` gets those that came since the last."""
from __future__ import annotations

from sgdsl.interpreter.stream_meta import merge_chunk, since


def _chunk(*ids: int, total: int) -> dict:
    return {"output_token_logprobs": [[-1.0, i, None] for i in ids],
            "output_top_logprobs": [[] for _ in ids], "completion_tokens": total}


def test_reads_get_the_entries_of_every_chunk_they_join() -> None:
    live = merge_chunk(None, _chunk(1, 2, total=2))
    first, seen = since(live, 0)
    assert [e[1] for e in first["output_token_logprobs"]] == [1, 2] and seen == 2
    live = merge_chunk(live, _chunk(3, total=3))
    snapshot = live
    live = merge_chunk(live, _chunk(4, 5, total=5))  # two chunks before the next read
    assert snapshot["output_token_logprobs_length"] == 3  # a later chunk does not leak in
    assert [e[1] for e in since(snapshot, seen)[0]["output_token_logprobs"]] == [3]
    joined, seen = since(live, seen)
    assert [e[1] for e in joined["output_token_logprobs"]] == [3, 4, 5]
    assert len(joined["output_top_logprobs"]) == 3 and joined["completion_tokens"] == 5
    assert joined["output_token_logprobs_length"] == seen == 5


def test_meta_without_logprobs_is_left_alone() -> None:
    assert merge_chunk(None, {"completion_tokens": 1}) == {"completion_tokens": 1}
    assert since({"completion_tokens": 1}, 0) == ({"completion_tokens": 1}, 0)
    assert since(None, 3) == (None, 3)
