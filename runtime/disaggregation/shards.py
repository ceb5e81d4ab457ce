"""A tensor-parallel decode server's ranks as disaggregation sees them: which kv heads each
rank's pool holds (the prefill server sends each rank those heads' pages), and the message
with which rank 0 tells every rank what to do with the requests whose transfers ended
(``decode.py``: every rank acts on it in the same step)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Verdicts:
    """tp: rank 0's decisions, broadcast to every rank: (key, "landed" | "fail", message)."""

    items: tuple[tuple[str, str, str], ...]


def head_range(rank: int, size: int, kv_heads: int) -> tuple[int, int]:
    """The model's kv heads a tensor-parallel rank holds (layers/linear.py's split: replicated
    when there are more ranks than kv heads)."""
    if kv_heads >= size:
        share = kv_heads // size
        return rank * share, (rank + 1) * share
    head = rank // (size // kv_heads)
    return head, head + 1
