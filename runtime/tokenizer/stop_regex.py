"""Stop regexes (SGLang's ``stop_regex``): the request finishes as soon as the detokenized output
contains a match of any pattern; the text is trimmed at the match start (unless
``no_stop_trim``), and ``finish_reason`` is ``{"type": "stop", "matched": <the pattern>}`` as in
SGLang.

Like stop strings, two halves: ``regex_window``/``first_match`` serve the scheduler's check on a
decoded tail of the output; ``partial_start`` serves streaming, which must not show text that a
pattern could still match once more tokens arrive.

NOTE: patterns are validated with the standard ``re`` module (SGLang's dialect) and searched
with the ``regex`` package, whose matcher takes a ``timeout``: a backtracking pattern such as
``(a|aa)+$`` takes seconds in ``re`` on 34 characters of output and doubles with each one more,
and the scheduler searches every step, so one request could stall every other. A search that runs
past ``SEARCH_TIMEOUT_S`` raises ``StopRegexTimeout``; the scheduler then fails that request with
a 400 naming the pattern (``scheduler/finish.py``). A pattern ``re`` accepts but ``regex`` does not
is refused at admission. The streaming holdback uses ``regex``'s ``partial=True`` search, which
reports a match that the end of the text cut short.
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Sequence

import regex  # a dependency of transformers (and of the runtime extra)

_UNBOUNDED = 1 << 30
_MAX_PATTERN_CHARS = 4096
# A linear search over a whole 32k-token output takes ~1 ms; anything near this is backtracking.
SEARCH_TIMEOUT_S = 0.05


class StopRegexTimeout(Exception):
    """A stop_regex search ran past ``SEARCH_TIMEOUT_S`` (the pattern backtracks)."""

    def __init__(self, pattern: str) -> None:
        super().__init__(
            f"stop_regex {pattern!r} took longer than {SEARCH_TIMEOUT_S * 1000:.0f} ms to search "
            "the output (its matching backtracks exponentially): simplify the pattern, e.g. "
            "without nested or overlapping repetitions like (a|aa)+ or (x+)+")
        self.pattern = pattern


def check_stop_regex(patterns: Sequence[str]) -> str | None:
    """Why ``patterns`` are not acceptable (None if they are)."""
    for p in patterns:
        if not isinstance(p, str) or not p:
            return "stop_regex must be a string or a list of non-empty strings"
        if len(p) > _MAX_PATTERN_CHARS:
            return f"stop_regex patterns must be at most {_MAX_PATTERN_CHARS} characters"
        try:
            re.compile(p)
        except re.error as exc:
            return f"stop_regex {p!r} is not a valid regular expression: {exc}"
        try:
            _compiled(p)
        except regex.error as exc:
            return f"stop_regex {p!r} is outside the supported regular-expression dialect: {exc}"
    return None


@lru_cache(maxsize=1024)
def _compiled(pattern: str) -> "regex.Pattern":
    return regex.compile(pattern)


@lru_cache(maxsize=1024)
def _max_chars(pattern: str) -> int:
    try:
        from re import _parser as sre_parse  # type: ignore[attr-defined]
    except ImportError:  # Python < 3.11
        import sre_parse  # type: ignore[no-redef]
    width = sre_parse.parse(pattern).getwidth()[1]
    return width if width < _UNBOUNDED else _UNBOUNDED


def regex_window(patterns: Sequence[str], n_out: int) -> int:
    """Tokens of output tail to decode so that any match of ``patterns`` fits in it.

    NOTE: a match of at most C characters has at most 4*C UTF-8 bytes and every token adds at
    least one byte; +2 covers a token that starts mid-character before it. An unbounded pattern
    (``\\d+``) needs the whole output.
    """
    chars = max((_max_chars(p) for p in patterns), default=0)
    if chars >= _UNBOUNDED:
        return n_out
    return min(n_out, 4 * chars + 2)


def first_match(text: str, patterns: Sequence[str], start: int = 0) -> tuple[int, str] | None:
    """(start index, pattern) of the earliest match at or after ``start``; ties: first pattern.
    Raises ``StopRegexTimeout`` for a search that backtracks past ``SEARCH_TIMEOUT_S``."""
    best: tuple[int, str] | None = None
    for p in patterns:
        try:
            m = _compiled(p).search(text, start, timeout=SEARCH_TIMEOUT_S)
        except TimeoutError:
            raise StopRegexTimeout(p) from None
        if m is not None and (best is None or m.start() < best[0]):
            best = (m.start(), p)
    return best


def partial_start(text: str, patterns: Sequence[str], start: int) -> int:
    """Earliest index >= ``start`` where a match could begin that more text might complete
    (``len(text)`` if none): streaming emits only what lies before it."""
    held = len(text)
    for p in patterns:
        try:
            m = _compiled(p).search(text, start, partial=True, timeout=SEARCH_TIMEOUT_S)
        except TimeoutError:  # the scheduler fails this request (its own search times out too)
            return start
        if m is not None and m.partial:
            held = min(held, m.start())
    return held
