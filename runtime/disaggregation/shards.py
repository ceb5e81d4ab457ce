"""Tensor parallelism on either side of disaggregation, as the transfer sees it: which kv heads
each rank's pool holds, which prefill rank sends which of them to a decode rank (``sources``:
resharding by heads when the two sides' tp sizes differ), and the messages with which rank 0
of a side tells every rank what to do with the requests whose transfers moved on (every rank
acts on them in the same step: ``decode.py``'s ``Verdicts``, ``prefill.py``'s ``Events``)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Verdicts:
    """tp: rank 0's decisions, broadcast to every rank: (key, "landed" | "fail", message)."""

    items: tuple[tuple[str, str, str], ...]


@dataclass(frozen=True)
class Events:
    """tp (prefill side): what rank 0 saw, broadcast to every rank in order: ("msg", a peer's
    announcement or registration), ("finish", key, error or None: rank 0's sends of key ended),
    ("expire", key: nobody registered in time), ("forget", key: an old registration)."""

    items: tuple[tuple, ...]


def head_range(rank: int, size: int, kv_heads: int) -> tuple[int, int]:
    """The model's kv heads a tensor-parallel rank holds (layers/linear.py's split: replicated
    when there are more ranks than kv heads)."""
    if kv_heads >= size:
        share = kv_heads // size
        return rank * share, (rank + 1) * share
    head = rank // (size // kv_heads)
    return head, head + 1


def sources(heads: tuple[int, int], prefill_size: int,
            kv_heads: int) -> list[tuple[int, int, int]]:
    """Who sends a decode rank holding kv heads ``[start, end)`` its pages: ``(prefill rank,
    first head, end head)`` runs covering the range in order, each head from the first prefill
    rank holding it (a replicated head is sent once). A prefill rank's heads are one run."""
    owners = [head_range(p, prefill_size, kv_heads) for p in range(prefill_size)]
    runs: list[tuple[int, int, int]] = []
    for head in range(*heads):
        owner = next(p for p, (lo, hi) in enumerate(owners) if lo <= head < hi)
        if runs and runs[-1][0] == owner:
            runs[-1] = (owner, runs[-1][1], head + 1)
        else:
            runs.append((owner, head, head + 1))
    return runs
