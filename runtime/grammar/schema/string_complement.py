"""A regex that fully matches every string except a finite set (``not: {enum: [...]}`` on
strings): the excluded strings form a trie, and a string is outside the set exactly when it
leaves the trie at some character (then anything may follow), or stops at a node that ends no
excluded string. Characters are written as ``\\uXXXX`` (no class metacharacter can leak);
strings with characters beyond the BMP are not handled (their escapes differ between regex
dialects).

The "anything may follow" tail is written once, after the alternation of the ways to leave the
trie, not once per trie node: xgrammar builds token-mask tables per position of each tail, so
a tail per node made a 5-word complement compile in 1.1 s (25x the raw schema), against ~0.05 s
with one (benchmarks/RESULTS.md, "Compile once").
"""
from __future__ import annotations

MAX_REGEX_CHARS = 4096  # longer complements are refused (compile cost grows with the trie)
MAX_EXCLUDED_CHARS = 512  # checked first: the trie is walked recursively, a level per character
_ANY = r"[\s\S]"  # any character, line breaks included


def complement_regex(excluded: list[str]) -> str | None:
    """An anchored regex for "a string not in ``excluded``" (None: too large or unspellable)."""
    if sum(map(len, excluded)) > MAX_EXCLUDED_CHARS or \
            any(ord(c) > 0xFFFF for s in excluded for c in s):
        return None
    trie: dict = {}
    for s in excluded:
        node = trie
        for c in s:
            node = node.setdefault(c, {})
        node[""] = {}  # the end of an excluded string
    leave, stop = f"{_leave(trie)}{_ANY}*", _stop(trie)
    regex = f"^({leave})$" if stop is None else f"^({leave})?$" if stop == "" else \
        f"^({leave}|{stop})$"
    return regex if len(regex) <= MAX_REGEX_CHARS else None


def _leave(node: dict) -> str:
    """The ways to leave the trie from ``node``: a character no excluded string continues
    with here (at the end of one with no longer one, any character)."""
    chars = sorted(c for c in node if c)
    out = [f"[^{''.join(_esc(c) for c in chars)}]" if chars else _ANY]
    out += [_esc(c) + _leave(node[c]) for c in chars]
    return out[0] if len(out) == 1 else f"({'|'.join(out)})"


def _stop(node: dict) -> str | None:
    """The continuations from ``node`` that stay in the trie and stop at a node ending no
    excluded string (None: there are none)."""
    out = [_esc(c) + sub for c in sorted(c for c in node if c)
           if (sub := _stop(node[c])) is not None]
    if "" in node:  # stopping here spells an excluded string
        return None if not out else out[0] if len(out) == 1 else f"({'|'.join(out)})"
    return f"({'|'.join(out)})?" if out else ""


def _esc(c: str) -> str:
    return c if c.isascii() and c.isalnum() else f"\\u{ord(c):04x}"
