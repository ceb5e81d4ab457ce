"""Continuations: how far a completion's length may jump when the model writes "," where the
completion plan closes values.

The forced-completion tracker (completion.py) keeps a reserve beside a request's ``need``: the
largest need the request has shown. Where the plan starts by closing values (``"}]}``), the
model may write "," after any of those closers instead (a new array item, another key), and a
``},`` token closes an item and opens the next at once: a jump in need the reserve had not
seen yet. ``Continuations.most`` measures those jumps (a search after each closer and a comma,
up to ``_LEVELS`` closers) so the reserve holds them before they happen.
"""
from __future__ import annotations

from typing import Any, Callable

from ..base import Grammar
from .shortest import CompletionSearch
from ..vocab import fast_encoder

_LEVELS = 3  # closers a continuation is looked for behind (each costs a search)
_CACHE = 4096


class Continuations:
    """Built once per tracker; ``count`` is the tracker's (cached) token count of a text."""

    def __init__(self, tokenizer: Any, search: CompletionSearch,
                 count: Callable[[str], int]) -> None:
        self.search = search
        self._count = count
        self._encode = fast_encoder(tokenizer)
        comma = tokenizer.encode(",", add_special_tokens=False)
        self._comma = comma[0] if len(comma) == 1 else None
        self._continuations: dict[tuple, int] = {}  # see most

    def most(self, grammar: Grammar, plan: str) -> int:
        """Where the plan starts by closing values (``"}]}``): the largest need if the model
        writes "," after any of those closers instead (a new array item, another key), which
        the peak must hold; 0 elsewhere. NOTE: the first new item was otherwise a jump the
        peak had not seen yet (a ``},`` token closes an item and opens the next at once)."""
        closers = len(plan) - len(plan.lstrip('"]}'))
        if self._comma is None or not closers:
            return 0
        # NOTE: kept per compiled grammar, local state and closers (the end-zone steps of
        # many requests ask again); an estimate like the peak it feeds, so a key that joins
        # two states (or an id reused by a later grammar) costs accuracy, not validity
        state, scope = grammar.state_key(), grammar.cache_scope()
        if state is None or scope is None:
            return self._search_after(grammar, plan, closers)
        key = (id(scope), state.local, plan[:min(closers, _LEVELS)])
        most = self._continuations.get(key)
        if most is None:
            most = self._continuations[key] = self._search_after(grammar, plan, closers)
            if len(self._continuations) > _CACHE:
                del self._continuations[next(iter(self._continuations))]
        return most

    def _search_after(self, grammar: Grammar, plan: str, closers: int) -> int:
        most = 0
        # NOTE: a closing quote counts (a '"},' token ends a string, an item, opens the next)
        for k in range(int(plan[0] == '"'), min(closers, _LEVELS) + 1):
            ids = self._encode(plan[:k]) if k else []
            ids.append(self._comma)
            if not grammar.accept_tokens(ids):
                continue
            try:
                found = self.search.search(grammar, check=False)
            finally:
                grammar.rollback(len(ids))
            if found is not None:
                most = max(most, len(ids) + self._count(found.text) + 1)
        return most
