"""Precompiles: warming the grammar caches ahead of requests (``Engine.precompile``, the server's
``POST /precompile``), in the scheduler process.

A batch of constraints is compiled exactly as requests' constraints are (``compiler.submit``:
the same limits, deadline, in-memory and on-disk caches), so a later request with one of them
finds it compiled, and the verdict returned for each is the one a request would get. Batches
are answered once every constraint is decided; the scheduler loop polls them each step, as it
polls requests waiting for grammars, and never blocks on them.

A batch does not take the compile queue from live requests: at most ``max_inflight`` of its
constraints (all batches together) are submitted at a time, the next ones as those finish, and
one the queue's admission refuses (busy) is submitted again at a later poll.
"""
from __future__ import annotations

import concurrent.futures as cf
from dataclasses import dataclass, field
from typing import Any, Sequence

from ...errors import InvalidRequestError, OverloadedError
from ..base import GrammarKey


@dataclass
class _Batch:
    call_id: int
    constraints: list[tuple[str, Any]]  # (kind, value) as a request carries it
    results: list[dict | None]
    pending: dict[int, Any] = field(default_factory=dict)  # index -> PendingGrammar
    next: int = 0  # the first constraint not submitted yet


class Precompiles:
    """Precompile batches in flight on one ``GrammarCompiler``."""

    def __init__(self, compiler: Any, max_inflight: int = 4) -> None:
        self.compiler = compiler
        self.max_inflight = max_inflight
        self._batches: list[_Batch] = []

    @property
    def busy(self) -> bool:
        return bool(self._batches)

    def add(self, call_id: int, constraints: Sequence[tuple[str, Any]]) -> None:
        """Start compiling ``constraints`` ((kind, value) pairs); answered by ``poll``."""
        items = list(constraints)
        self._batches.append(_Batch(call_id, items, [None] * len(items)))
        self._submit()

    def poll(self) -> list[tuple[int, list[dict]]]:
        """(call id, one result per constraint) of every batch now decided. A result is
        ``{"ok": True, "kind": ...}`` or ``{"ok": False, "kind", "error", "field",
        "status"}``: the error a request with that constraint would get."""
        done = []
        for batch in self._batches:
            for index, pending in list(batch.pending.items()):
                if pending.ready():
                    del batch.pending[index]
                    batch.results[index] = _outcome(batch.constraints[index][0], pending)
        self._submit()
        for batch in self._batches:
            if batch.next == len(batch.constraints) and not batch.pending:
                done.append((batch.call_id, batch.results))
        self._batches = [b for b in self._batches if b.pending or b.next < len(b.constraints)]
        return done

    def futures(self) -> list[cf.Future]:
        """The compiles in flight (for the scheduler's idle wait)."""
        return [p.future() for b in self._batches for p in b.pending.values()]

    def _submit(self) -> None:
        room = self.max_inflight - sum(len(b.pending) for b in self._batches)
        for batch in self._batches:
            while room > 0 and batch.next < len(batch.constraints):
                index, (kind, value) = batch.next, batch.constraints[batch.next]
                try:
                    batch.pending[index] = self.compiler.submit(
                        GrammarKey.from_constraint(kind, value))
                    room -= 1
                except InvalidRequestError as e:
                    batch.results[index] = _error(kind, e)
                except OverloadedError:  # the queue is long: submitted again at a later poll
                    return
                batch.next += 1


def _outcome(kind: str, pending: Any) -> dict:
    try:
        pending.result()  # a matcher (cheap), or the request's error
    except InvalidRequestError as e:
        return _error(kind, e)
    return {"ok": True, "kind": kind}


def _error(kind: str, e: InvalidRequestError) -> dict:
    return {"ok": False, "kind": kind, "error": e.message, "field": e.field,
            "status": getattr(e, "status", 400)}


def parse_constraints(constraints: Any) -> tuple[list[tuple[int, tuple[str, Any]]],
                                                 list[dict | None]]:
    """Check ``Engine.precompile``'s argument in the caller's thread: ((index, (kind, value))
    for each well-formed constraint, the results list with the malformed ones' errors filled
    in). Raises ``InvalidRequestError`` unless ``constraints`` is a list of dicts."""
    from ...sampling_params import SamplingParams

    if not isinstance(constraints, (list, tuple)) or not all(
            isinstance(c, dict) for c in constraints):
        raise InvalidRequestError("constraints must be a list of objects such as "
                                  '{"json_schema": ...}, {"regex": ...} or {"ebnf": ...}',
                                  field="constraints")
    parsed, results = [], [None] * len(constraints)
    for index, fields in enumerate(constraints):
        kinds = [k for k in ("json_schema", "regex", "ebnf") if fields.get(k) is not None]
        try:
            extra = sorted(set(fields) - {"json_schema", "regex", "ebnf"})
            if extra or not kinds:
                raise InvalidRequestError(
                    "a constraint has exactly one of json_schema, regex, ebnf"
                    + (f"; unknown field(s): {', '.join(extra)}" if extra else ""),
                    field=extra[0] if extra else "constraints")
            constraint = SamplingParams.from_dict(fields).constraint
            GrammarKey.from_constraint(*constraint)  # the kind and text are well formed
            parsed.append((index, constraint))
        except InvalidRequestError as e:
            results[index] = _error(kinds[0] if kinds else "unknown", e)
    return parsed, results
