"""Where a completion plan still applies after the model wrote other values than the plan's.

A completion estimate (completion.py) is the shortest text that completes a JSON value from
where the output stood: ``", "age": 0, "city": ""}`` from inside a name. The model rarely
writes the plan itself: it writes a longer name, the age 36, a city. But the *structure* it
writes usually is the plan's (the keys a schema requires, in its order), so the plan's rest
from where the output now stands is still a completion of nearly the same length, found
without a search. ``rest_after`` walks the plan and the new text as JSON events side by side:
punctuation must be equal, keys equal (a key decides what follows), while a value string,
number or literal may differ from the plan's (what follows a value does not depend on it).

An estimate only: a pattern, format or range may want more characters where the plan's value
ended, and a real search from the request's state makes the measurement that forces.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

_NUMBER = frozenset("-+.0123456789eE")
_LITERALS = ("true", "false", "null")


class _Event(NamedTuple):
    kind: str  # one of "{}[],:" or "s" (string), "n" (number), "l" (literal)
    text: str  # a string's raw content, a number's or literal's spelling
    end: int  # offset just past the event in its text
    closed: bool  # a string's closing quote, a literal's last letter was seen


def rest_after(plan: str, new: str, in_string: bool = False) -> str | None:
    """The part of ``plan`` still to write after ``new`` (written since the plan was found
    where ``plan`` would have started), or None if ``new`` left the plan's structure.
    ``in_string``: both start inside a string (the plan's first quote closes it)."""
    if in_string:  # seen from the string's opening quote
        return rest_after('"' + plan, '"' + new)
    ours, theirs = _plan_events(plan), _events(new)
    if ours is None or theirs is None or not theirs or len(theirs) > len(ours):
        return None
    for i, (mine, got) in enumerate(zip(ours, theirs)):
        last = i == len(theirs) - 1
        if mine.kind != got.kind or not _same(mine, got, ours, i, last):
            return None
    mine, got = ours[len(theirs) - 1], theirs[-1]
    if got.kind == "s" and not got.closed:  # inside a string: the plan closes it
        if not mine.closed:
            return None
        if _is_key(ours, len(theirs) - 1):
            return plan[mine.end - 1 - len(mine.text) + len(got.text):]
        return plan[mine.end - 1:]
    if got.kind == "l" and not got.closed:  # the literal the model began, then the plan
        word = next(w for w in _LITERALS if w.startswith(got.text))
        return word[len(got.text):] + plan[mine.end:]
    return plan[mine.end:]


def _same(mine: _Event, got: _Event, ours: list[_Event], i: int, last: bool) -> bool:
    if mine.kind == "s":
        if not _is_key(ours, i):
            return True  # a value string: its content does not matter
        if last and not got.closed:  # a key being written: so far the plan's
            return mine.text.startswith(got.text)
        return mine.text == got.text and mine.closed == got.closed
    if mine.kind == "l":
        return got.closed or (last and any(w.startswith(got.text) for w in _LITERALS))
    return True  # punctuation (kinds equal) or a number


def _is_key(events: list[_Event], i: int) -> bool:
    return i + 1 < len(events) and events[i + 1].kind == ":"


@functools.lru_cache(maxsize=4096)
def _plan_events(plan: str) -> list[_Event] | None:
    """``_events`` of a plan: a batch of one schema's requests shares a few plans (the
    same keys and shortest values from the same states). Callers do not modify the list."""
    return _events(plan)


def _string_end(text: str, start: int) -> int:
    """The offset of the quote closing the string whose content starts at ``start`` (an
    escaped quote does not close it), or ``len(text)`` if it is still open."""
    j = start
    while (k := text.find('"', j)) >= 0:
        b = k
        while b > start and text[b - 1] == "\\":
            b -= 1
        if (k - b) % 2 == 0:  # an even run of backslashes before it: not escaped
            return k
        j = k + 1
    return len(text)


def _events(text: str) -> list[_Event] | None:
    """JSON events of ``text`` (whitespace skipped); None where it is not JSON-like."""
    out: list[_Event] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in " \t\r\n":
            i += 1
        elif c in "{}[],:":
            out.append(_Event(c, c, i + 1, True))
            i += 1
        elif c == '"':
            j = _string_end(text, i + 1)
            out.append(_Event("s", text[i + 1:j], j + 1, j < n))
            i = j + 1
        elif c in _NUMBER:
            j = i
            while j < n and text[j] in _NUMBER:
                j += 1
            out.append(_Event("n", text[i:j], j, True))
            i = j
        elif c.isalpha():
            j = i
            while j < n and text[j].isalpha():
                j += 1
            word = text[i:j]
            if not any(w.startswith(word) for w in _LITERALS):
                return None
            out.append(_Event("l", word, j, word in _LITERALS))
            i = j
        else:
            return None
    return out
