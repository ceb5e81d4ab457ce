"""Two common lookahead idioms spelled without lookarounds (xgrammar ignores them: ``^(?!clyde)
.*$`` let "clyde" through), each exactly:

- a leading negative lookahead of one literal, ``^(?!L)REST$`` (paper-plugin's
  ``^(?!io\\.papermc\\.)...``): a match of REST that does not start with L either stops
  inside L (a proper prefix of L that REST matches whole) or leaves L at some character: for
  each k, ``L[:k]`` then what REST still matches after it (``pattern_meet.derive``) with its
  first character anything but ``L[k]`` (``first_not``);
- the "tempered" token ``^((?!W).)*$`` (webhook's "name cannot contain clyde"), W a sequence
  of character sets that are pairwise disjoint (``(c|C)(l|L)...``): every W[0] character
  starts the word afresh (none belongs to a later set, so no earlier partial match survives
  it), so the string is ``[^A]*`` then any number of W[0] characters, each followed by a run
  without one that does not spell the rest of W.

``.`` never matches a line terminator in JSON Schema's dialect; the spellings here leave out
\\n, \\r, U+2028 and U+2029 wherever the pattern had ``.`` or a negated set (never wider).
Anything else raises ``Unfoldable`` (the caller rejects the pattern, as before).
"""
from __future__ import annotations

import re

from .pattern_meet import derive, literal_text, literal_strings
from .patterns import Node, Unfoldable, parse_pattern

MAX_REGEX_CHARS = 8192
_LINE_ENDS = r"\n\r\u2028\u2029"
_LEADING = re.compile(r"^\^\(\?!((?:[^()\\]|\\.)+)\)(.*)$", re.DOTALL)
_TEMPERED = re.compile(r"^\^\(\(\?!((?:[^\\]|\\.)+)\)\.\)\*\$$", re.DOTALL)
_CLASS_ESCAPES = {r"\d": "0-9", r"\w": "A-Za-z0-9_"}


def without_lookaround(pattern: str) -> str:
    """An equal pattern with no lookaround (``Unfoldable`` if not one of the idioms above)."""
    m = _TEMPERED.match(pattern)
    if m:
        out = _avoid_word(m.group(1))
    else:
        m = _LEADING.match(pattern)
        if not m:
            raise Unfoldable("only ^(?!literal)...$ and ^((?!word).)*$ lookaheads are spelled")
        out = _not_starting_with(m.group(1), "^" + m.group(2))
    if len(out) > MAX_REGEX_CHARS:
        raise Unfoldable("the pattern without its lookahead is too large")
    return out


def _not_starting_with(banned: str, rest: str) -> str:
    strings = literal_strings(banned)
    if strings is None or len(strings) != 1 or not strings[0]:
        raise Unfoldable("the lookahead is not one literal string")
    word = strings[0]
    if not rest.endswith("$") or rest.endswith("\\$"):
        raise Unfoldable("the pattern after the lookahead is not anchored at its end")
    tree = parse_pattern(rest)
    branches = []
    for k, c in enumerate(word):
        tail = first_not(tree, c) if tree is not None else None
        nullable = tree is not None and re.fullmatch(tree.text, "") is not None
        body = "|".join(t for t in (tail,) if t is not None)
        if body:
            body = f"({body}){{0,1}}" if nullable else f"({body})"
        elif not nullable:
            body = None
        if body is not None:
            branches.append(literal_text(word[:k]) + body)
        tree = derive(tree, c) if tree is not None else None
    if not branches:
        return "^[^\\s\\S]$"  # nothing: every match of the pattern starts with the literal
    return f"^({'|'.join(branches)})$"


def first_not(node: Node, c: str) -> str | None:
    """A regex for the (non-empty) strings ``node`` matches whose first character is not
    ``c`` (None: there are none)."""
    if node.kind == "atom":
        return _class_without(node.text, c)
    if node.kind == "group":
        return first_not(node.children[0], c)
    if node.kind == "alt":
        alts = [t for t in (first_not(b, c) for b in node.children) if t is not None]
        return "|".join(f"({t})" for t in alts) or None
    if node.kind == "seq":
        alts = []
        for i, item in enumerate(node.children):
            head = first_not(item, c)
            if head is not None:
                alts.append(f"({head})" + "".join(n.atom_text() for n in node.children[i + 1:]))
            if item.width[0] > 0:
                break
        return "|".join(f"({t})" for t in alts) or None
    inner = node.children[0]  # a repeat: its first copy starts the string
    if inner.width[0] == 0:
        raise Unfoldable("a repeat that may match the empty string leads the pattern")
    head = first_not(inner, c)
    if head is None or node.hi == 0:
        return None
    lo, hi = max(node.lo - 1, 0), None if node.hi is None else node.hi - 1
    more = "" if hi == 0 else f"({inner.atom_text()}){{{lo},{'' if hi is None else hi}}}"
    return f"({head}){more}"


def _class_without(atom: str, c: str) -> str | None:
    """The one-character ``atom`` less the character ``c``."""
    if re.fullmatch(atom, c) is None and atom != ".":
        return atom
    esc = _esc(c)
    if atom == ".":
        return f"[^{_LINE_ENDS}{esc}]"
    if len(atom) == 1 or atom.startswith("\\") and not atom[1].isalnum():
        return None  # the literal c itself
    if atom in _CLASS_ESCAPES:
        atom = f"[{_CLASS_ESCAPES[atom]}]"
    if atom.startswith("[^"):
        return f"[^{esc}{atom[2:-1]}]"  # first: after a trailing '-' it would make a range
    if atom.startswith("[") and "\\" not in atom.replace("\\d", "").replace("\\w", ""):
        return _split_class(atom[1:-1], c)
    raise Unfoldable(f"cannot take {c!r} out of {atom}")


def _split_class(body: str, c: str) -> str | None:
    """A positive class body (literals, ranges, \\d, \\w) without ``c``."""
    for name, spelled in _CLASS_ESCAPES.items():
        body = body.replace(name, spelled)
    parts, i = [], 0
    while i < len(body):
        lo = hi = body[i]
        if i + 2 < len(body) and body[i + 1] == "-":
            hi, i = body[i + 2], i + 3
        else:
            i += 1
        for a, b in ((lo, chr(ord(c) - 1)), (chr(ord(c) + 1), hi)) if lo <= c <= hi else \
                ((lo, hi),):
            if a <= b:
                parts.append(_esc(a) if a == b else f"{_esc(a)}-{_esc(b)}")
    return f"[{''.join(parts)}]" if parts else None


def _avoid_word(word: str) -> str:
    sets = _char_sets(parse_pattern(word))
    if len(sets) < 2 or any(a & b for i, a in enumerate(sets) for b in sets[i + 1:]):
        raise Unfoldable("the tempered word is not a sequence of disjoint character sets")
    first = "".join(_esc(x) for x in sorted(sets[0]))
    other = f"[^{first}{_LINE_ENDS}]"
    # after a W[0] character: a run without one that does not spell W[1:]
    tail = ""
    for s in reversed(sets[1:]):
        chars = "".join(_esc(x) for x in sorted(s))
        stop = f"[^{first}{chars}{_LINE_ENDS}]{other}*"
        tail = f"{stop}|[{chars}]({tail})" if tail else stop
        tail = f"({tail}){{0,1}}"
    return f"^{other}*([{first}]{tail})*$"


def _char_sets(node: Node) -> list[set[str]]:
    items = node.children if node.kind == "seq" else [node]
    out = []
    for item in items:
        strings = literal_strings(item.text)
        if strings is None or any(len(s) != 1 for s in strings):
            raise Unfoldable("the tempered word is not a sequence of single characters")
        out.append(set(strings))
    return out


def _esc(c: str) -> str:
    return c if c.isascii() and c.isalnum() else f"\\u{ord(c):04x}"
