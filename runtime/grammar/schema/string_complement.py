"""A regex that fully matches every string except a finite set (``not: {enum: [...]}`` on
strings): the excluded strings form a trie, and a string is outside the set exactly when it
leaves the trie at some character, stops at a node that ends no excluded string, or runs on
past one that does. Characters are written as ``\\uXXXX`` (no class metacharacter can leak);
strings with characters beyond the BMP are not handled (their escapes differ between regex
dialects)."""
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
    regex = f"^{_outside(trie)}$"
    return regex if len(regex) <= MAX_REGEX_CHARS else None


def _outside(node: dict) -> str:
    """The continuations, from ``node``, of strings that are not excluded."""
    chars = sorted(c for c in node if c)
    leave = f"[^{''.join(_esc(c) for c in chars)}]{_ANY}*" if chars else f"{_ANY}+"
    body = "|".join([leave] + [_esc(c) + _outside(node[c]) for c in chars])
    # stopping here is allowed unless an excluded string ends here
    return f"({body})" if "" in node else f"({body})?"


def _esc(c: str) -> str:
    return c if c.isascii() and c.isalnum() else f"\\u{ord(c):04x}"
