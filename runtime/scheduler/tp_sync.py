"""The two scheduler decisions that depend on timing rather than on the messages, made by
rank 0 and followed by every tensor-parallel rank (``process.py`` explains the scheme):

- which grammar compiles are done (compile threads finish at different times on each rank,
  and a compile may miss its deadline on one rank only): rank 0 polls, broadcasts the
  outcome per request, and the other ranks wait for exactly those compiles;
- the idle-integrity answer: every rank checks its own pools, rank 0 answers for all.
All calls are collectives: every rank reaches them at the same point of the same step.
"""
from __future__ import annotations

from typing import Any

from ..distributed.collectives import broadcast_object, gather_object
from ..distributed.state import get_world_group
from ..errors import InvalidRequestError
from ..ipc import messages as m


def poll_grammars(grammar: Any) -> tuple[list[Any], list[tuple[Any, InvalidRequestError]]]:
    """``grammar.poll()`` on rank 0, the same outcome on every rank."""
    tp = get_world_group()  # pp: every rank of every stage
    if tp.size == 1:
        return grammar.poll()
    if tp.is_first:
        ready, failed = grammar.poll()
        broadcast_object([(r.rid, None) for r in ready] + [(r.rid, e) for r, e in failed])
        return ready, failed
    return grammar.take(broadcast_object(None))


def integrity_resp(call_id: int, local: m.RpcResp) -> m.RpcResp:
    """Rank 0's reply covering every rank's idle check."""
    results = gather_object((local.ok, local.error))
    if results is None or len(results) == 1:
        return local  # a follower (its answer went to rank 0), or the only rank
    bad = [f"rank {rank}: {error}" for rank, (ok, error) in enumerate(results) if not ok]
    return m.RpcResp(call_id, ok=not bad, error="; ".join(bad) or None)
