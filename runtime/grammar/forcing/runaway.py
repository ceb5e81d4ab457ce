"""Runaway output, for the repetition guard of ``completion.py``: the newest tokens repeat one
pattern, and that repetition is degenerate rather than the shape of a legitimate value.

A short period (at most ``SHORT_PERIOD`` tokens: one token again and again, digits forever) is
runaway wherever it is. A longer one (up to half the window: ``golang-golang-...``, ``{"a":
[{"a": [...``) is runaway only inside one string or number (the whole repetition is one
scalar) or where each repetition nests deeper (``depth`` grows); an array of similar items at
one depth is what a JSON array often is, so it is left to the budget. Only the period check
runs on the schedule (list comparisons); the text is decoded and scanned only when a long
period was found.
"""
from __future__ import annotations

from typing import Any, Sequence

SHORT_PERIOD = 4
_NUMBER_START = "-0123456789"
_NUMBER_BODY = "0123456789.eE+-"


def period(ids: Sequence[int], window: int) -> int:
    """The smallest p <= window // 2 such that the last ``window + p`` tokens repeat with
    period p (so at least three repetitions, and the whole window is covered); 0 if none."""
    if window <= 0:
        return 0
    for p in range(1, max(SHORT_PERIOD, window // 2) + 1):
        if len(ids) < window + p:
            return 0
        tail = ids[-window - p:]
        if tail[p:] == tail[:-p]:
            return p
    return 0


def is_runaway(tokenizer: Any, ids: Sequence[int], window: int) -> bool:
    """True if the newest tokens of ``ids`` are a runaway repetition (see the module doc)."""
    p = period(ids, window)
    if not p or p <= SHORT_PERIOD:
        return bool(p)
    span = window + p
    text = tokenizer.decode(list(ids))
    start = len(tokenizer.decode(list(ids[:-span])))  # where the repetition begins
    return runs_away(text, start)


def runs_away(text: str, start: int) -> bool:
    """True if ``text[start:]`` lies inside one string or number that began before it, or
    ends at least two levels deeper than it began. Text that is not JSON (a regex match) is
    one value: runaway."""
    head = text.lstrip()
    if not head or head[0] not in '{["' + _NUMBER_START:
        return True
    depth, at_start, scalar = 0, None, None  # scalar: where the open string/number began
    in_string = escaped = False
    for i, c in enumerate(text):
        if i == start:
            at_start = depth
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string, scalar = False, None
            continue
        if c == '"':
            in_string, scalar = True, i
        elif scalar is not None and c in _NUMBER_BODY:
            continue  # inside a number
        elif c in _NUMBER_START:
            scalar = i
        else:
            scalar = None
            depth += (c in "{[") - (c in "}]")
    if at_start is None:
        return False
    return (scalar is not None and scalar < start) or depth - at_start >= 2
