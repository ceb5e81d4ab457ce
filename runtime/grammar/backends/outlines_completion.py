"""Shortest completions of an outlines DFA, read from a table built at compile time.

An outlines-core index is a DFA whose state is the matcher's whole state, so how far each
state is from acceptance is a property of the compiled grammar alone: ``completion_table``
works it out once, in the compile worker, and a completion from any state it covers is then a
walk of the completion's length (``CompletionTable.path``). The bounded search (shortest.py)
visits every state nearer than the answer instead: on Snowplow sp_400, whose many optional
members make thousands of states, 256 expansions from inside its first array found nothing
(1024 found the 51-token answer) and the schema suite's generations were cut at their budget.

The moves are the search's: single-character ASCII tokens, each state's next move the one a
character nearer to a final state (ties in ``vocab.PRIORITY`` order, so answers read like the
search's). States those moves do not reach from the start (only non-ASCII text leads there)
are not covered, and a grammar of more than ``MAX_STATES`` such states gets no table: the
search handles both as before.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

# NOTE: the forward walk makes one get_next_state call per state and character (~0.2 us:
# 2262 states, 40 ms for sp_400); this bounds the compile time and the table's size.
MAX_STATES = 1 << 16


@dataclass(frozen=True)
class CompletionTable:
    """``hops[state]``: (token id, next state) one character nearer to a final state."""

    hops: dict[int, tuple[int, int]]
    finals: frozenset[int]

    def path(self, state: int) -> tuple[int, ...] | None:
        """Token ids from ``state`` to a final state (shortest in characters); None if the
        table does not cover ``state``."""
        ids: list[int] = []
        while state not in self.finals:
            hop = self.hops.get(state)
            if hop is None:
                return None
            ids.append(hop[0])
            state = hop[1]
        return tuple(ids)


def completion_table(index: Any, alphabet: Sequence[int]) -> CompletionTable | None:
    """The table of ``index`` (an outlines-core Index) over the single-character tokens
    ``alphabet`` (ids in priority order); None past ``MAX_STATES`` states."""
    back = _predecessors(index, alphabet)
    if back is None:
        return None
    finals = frozenset(s for s in index.get_final_states() if s in back)
    rank = {tid: i for i, tid in enumerate(alphabet)}
    return CompletionTable(_hops(back, finals, rank), finals)


def _predecessors(index: Any, alphabet: Sequence[int]) -> dict[int, list] | None:
    """state -> [(state before, token id)] over the states ``alphabet`` reaches from the
    start; None past ``MAX_STATES`` states."""
    start = index.get_initial_state()
    back: dict[int, list] = {start: []}
    order = [start]
    step = index.get_next_state
    for state in order:  # grows as states are found: breadth-first
        for tid in alphabet:
            after = step(state, tid)
            if after is None:
                continue
            if after not in back:
                if len(back) >= MAX_STATES:
                    return None
                back[after] = []
                order.append(after)
            back[after].append((state, tid))
    return back


def _hops(back: dict[int, list], finals: frozenset[int],
          rank: dict[int, int]) -> dict[int, tuple[int, int]]:
    """Breadth-first from the final states along ``back``: each state's move to a state one
    character nearer, the move of lowest ``rank`` among equally near ones."""
    dist = dict.fromkeys(finals, 0)
    hops: dict[int, tuple[int, int]] = {}
    layer, d = list(finals), 0
    while layer:
        d += 1
        found = []
        for state in layer:
            for before, tid in back[state]:
                if before not in dist:
                    dist[before] = d
                    hops[before] = (tid, state)
                    found.append(before)
                elif dist[before] == d and rank[tid] < rank[hops[before][0]]:
                    hops[before] = (tid, state)  # as near, earlier in priority order
        layer = found
    return hops
