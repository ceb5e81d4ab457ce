"""Two ``pattern`` keywords on one string (``allOf: [{format: uri}, {pattern: "^https?://"}]``)
met in one regex, where one of them is a *prefix* pattern: anchored at the start only, its
matches a few literal strings (``^https?://`` is "http://" or "https://"). JSON Schema searches a
pattern, so such a pattern says "starts with one of these"; the meet is then the union, over
each prefix ``l``, of ``l`` followed by the other pattern's derivative by ``l`` (what the other
pattern must still match after reading ``l``), computed on the parsed regex one character at a
time. The other pattern must be anchored at both ends (then searching it is matching it whole,
so the meet is exact); anything else raises ``Unfoldable``.
"""
from __future__ import annotations

import re
from typing import Any

from .patterns import Node, Unfoldable, parse_pattern
from .rejection import Impossible, reject

MAX_PREFIXES = 16  # literal strings a prefix pattern may stand for
MAX_REGEX_CHARS = 8192
_END = re.compile(r"(?<!\\)\$$")  # an end anchor (not an escaped dollar)


def meet_pattern_keywords(a: Any, b: Any, path: str) -> str:
    """``meet_patterns`` for two ``pattern`` values met in a merge (rejected, or impossible)."""
    try:
        met = meet_patterns(a, b) if isinstance(a, str) and isinstance(b, str) else None
    except Unfoldable as e:
        raise reject("pattern", path, f"two patterns meet and only a prefix of a few literal "
                                      f"strings can be met with another pattern ({e})") from None
    if met is None:
        raise Impossible(path, "no string matches both patterns", "pattern")
    return met


def meet_patterns(a: str, b: str) -> str | None:
    """One anchored regex for strings that fully match one pattern and start with a match of
    the other, a prefix pattern (None: no string does; ``Unfoldable`` if neither is one)."""
    for prefix, other in ((a, b), (b, a)):
        strings = _prefix_strings(prefix)
        if strings is not None:
            break
    else:
        raise Unfoldable("neither pattern is a prefix of a few literal strings")
    tree = parse_pattern(other)
    if not (other.startswith("^") and _END.search(other)) or tree.kind == "alt":
        raise Unfoldable("the other pattern is not anchored at both ends")
    branches = []
    for s in strings:
        rest = tree
        for c in s:
            rest = derive(rest, c)
            if rest is None:
                break
        if rest is not None:
            branches.append(literal_text(s) + rest.text if rest.kind != "alt" else
                            f"{literal_text(s)}({rest.text})")
    if not branches:
        return None
    out = f"^({'|'.join(branches)})$" if len(branches) > 1 else f"^{branches[0]}$"
    if len(out) > MAX_REGEX_CHARS:
        raise Unfoldable("the met pattern is too large")
    return out


def _prefix_strings(pattern: str) -> list[str] | None:
    """The literal strings a start-anchored, end-open pattern matches, or None."""
    if not pattern.startswith("^") or _END.search(pattern):
        return None
    try:
        return _literals(parse_pattern(pattern))
    except Unfoldable:
        return None


def literal_strings(pattern: str) -> list[str] | None:
    """The few literal strings ``pattern`` matches whole (None: not such a pattern)."""
    try:
        return _literals(parse_pattern(pattern))
    except Unfoldable:
        return None


def _literals(node: Node) -> list[str] | None:
    if node.kind == "atom":
        if node.text.startswith("\\") and not node.text[1].isalnum():
            return [node.text[1]]
        return [node.text] if len(node.text) == 1 and node.text != "." else None
    if node.kind == "group":
        return _literals(node.children[0])
    parts = [_literals(c) for c in node.children]
    if any(p is None for p in parts):
        return None
    if node.kind == "alt":
        out = [s for p in parts for s in p]
    elif node.kind == "seq":
        out = [""]
        for p in parts:
            out = [x + y for x in out for y in p]
            if len(out) > MAX_PREFIXES:
                return None
    else:  # a repeat
        if node.hi is None or node.hi > MAX_PREFIXES:
            return None
        out = []
        for k in range(node.lo, node.hi + 1):
            seq = [""]
            for _ in range(k):
                seq = [x + y for x in seq for y in parts[0]]
            out += seq
    out = list(dict.fromkeys(out))
    return out if len(out) <= MAX_PREFIXES else None


def derive(node: Node, c: str) -> Node | None:
    """What ``node`` must match after reading ``c`` (None: nothing)."""
    text = _derivative_text(node, c)
    return None if text is None else parse_pattern(text)


def _derivative_text(node: Node, c: str) -> str | None:
    if node.kind == "atom":
        return "" if re.fullmatch(node.text, c, re.DOTALL if node.text == "." else 0) else None
    if node.kind == "group":
        return _derivative_text(node.children[0], c)
    if node.kind == "alt":
        alts = [t for t in (_derivative_text(b, c) for b in node.children) if t is not None]
        return None if not alts else alts[0] if len(alts) == 1 else "|".join(
            _wrap(t) for t in alts)
    if node.kind == "seq":
        alts = []
        for i, item in enumerate(node.children):
            head = _derivative_text(item, c)
            if head is not None:
                rest = "".join(n.atom_text() for n in node.children[i + 1:])
                alts.append(_wrap(head) + rest)
            if item.width[0] > 0:  # the item cannot be skipped: no later one reads c
                break
        return None if not alts else alts[0] if len(alts) == 1 else "|".join(
            _wrap(t) for t in alts)
    inner = node.children[0]  # a repeat: one more copy started, fewer left
    if node.hi == 0:
        return None
    head = _derivative_text(inner, c)
    if head is None:
        return None
    lo, hi = max(node.lo - 1, 0), None if node.hi is None else node.hi - 1
    more = "" if hi == 0 else f"{_atom(inner)}{{{lo},{'' if hi is None else hi}}}"
    return _wrap(head) + more


def _wrap(text: str) -> str:
    """``text`` safe to concatenate (an alternation gets a group)."""
    return f"({text})" if "|" in text and not _grouped(text) else text


def _grouped(text: str) -> bool:
    try:
        tree = parse_pattern(text)
    except Unfoldable:
        return False
    return tree.kind != "alt"


def _atom(node: Node) -> str:
    text = node.atom_text()
    return text if node.kind in ("atom", "group") else f"({text})"


def literal_text(s: str) -> str:
    return "".join(c if c.isascii() and c.isalnum() else f"\\u{ord(c):04x}" for c in s)
