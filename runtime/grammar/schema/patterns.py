"""A ``pattern`` parsed into the structure length folding needs (``pattern_length.py``): atoms
one code point wide (a literal, a class ``[...]``, an escape like ``\\d``, ``.``), groups,
alternations, sequences and quantified atoms, each with its width range and its text as written.

Only the part of the regex language whose meaning JSON Schema's ECMA-262 dialect, Python's ``re``
and xgrammar share is accepted; anything else (lookarounds, backreferences, word boundaries,
inline flags, named groups, ``{,n}``, possessive quantifiers, anchors inside the pattern) raises
``Unfoldable``. The parsed width is checked against Python's own parser, so a construct read
differently here and there is refused rather than mis-measured.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

try:  # the parser behind ``re``: its width of the whole pattern is the cross-check
    import re._parser as _sre_parse  # type: ignore[import-not-found]
except ImportError:  # Python < 3.11
    import sre_parse as _sre_parse  # type: ignore[no-redef]

_CLASS_ESCAPES = set("dDwWsSntrfv")
_QUANT = re.compile(r"\*|\+|\?|\{(\d+)\}|\{(\d+),(\d*)\}")


class Unfoldable(Exception):
    """The pattern is outside what length folding handles (the message says what)."""


@dataclass
class Node:
    kind: str  # "atom", "group", "alt", "seq", "rep"
    text: str  # as written (a group with its parentheses, a repeat with its quantifier)
    children: list["Node"] = field(default_factory=list)
    lo: int = 1  # a repeat's count range (hi None: unbounded)
    hi: int | None = 1
    width: tuple[int, int | None] = (1, 1)

    def atom_text(self) -> str:
        """The text, safe to concatenate with others or to quantify."""
        if self.kind == "alt":
            return f"({self.text})"
        return self.text


def parse_pattern(pattern: str) -> Node:
    """The tree of ``pattern`` (whole-string matching: one leading ``^`` and one trailing ``$``
    per top-level alternative are dropped)."""
    parser = _Parser(pattern)
    tree = parser.alternation(top=True)
    if parser.i != len(pattern):
        raise Unfoldable(f"unbalanced ')' at {parser.i}")
    try:
        lo, hi = _sre_parse.parse(pattern).getwidth()
    except (re.error, OverflowError, RecursionError) as e:
        raise Unfoldable(f"the pattern does not parse: {e}") from None
    if (lo, None if hi >= _sre_parse.MAXREPEAT else hi) != tree.width:
        raise Unfoldable("Python reads the pattern's width differently")
    return tree


class _Parser:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0

    def alternation(self, top: bool = False) -> Node:
        branches = [self.sequence(top)]
        while self._peek() == "|":
            self.i += 1
            branches.append(self.sequence(top))
        if len(branches) == 1:
            return branches[0]
        widths = [b.width for b in branches]
        his = [w[1] for w in widths]
        # NOTE: joined from the branches, which left their top-level anchors out
        return Node("alt", "|".join(b.text for b in branches), branches,
                    width=(min(w[0] for w in widths), None if None in his else max(his)))

    def sequence(self, top: bool) -> Node:
        if top and self._peek() == "^":
            self.i += 1
        start, items = self.i, []
        while self._peek() not in ("", "|", ")"):
            if top and self._peek() == "$" and self._peek(1) in ("", "|"):
                text = self.s[start:self.i]
                self.i += 1
                return _seq(text, items)
            items.append(self.quantified())
        return _seq(self.s[start:self.i], items)

    def quantified(self) -> Node:
        start = self.i
        atom = self.atom()
        m = _QUANT.match(self.s, self.i)
        if m is None:
            if self._peek() == "{":
                raise Unfoldable(f"'{{' at {self.i} is not a quantifier")
            return atom
        self.i = m.end()
        if self._peek() == "+":
            raise Unfoldable("possessive quantifier")
        if self._peek() == "?":
            self.i += 1  # lazy: the same strings match
        q = m.group(0)
        lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}.get(q, (0, 0))
        if m.group(1) is not None:
            lo = hi = int(m.group(1))
        elif m.group(2) is not None:
            lo, hi = int(m.group(2)), (int(m.group(3)) if m.group(3) else None)
        if hi is not None and lo > hi:
            raise Unfoldable(f"quantifier {q} is empty")
        a_lo, a_hi = atom.width
        if hi == 0 or a_hi == 0:
            top = 0
        else:
            top = None if hi is None or a_hi is None else a_hi * hi
        width = (a_lo * lo, top)
        return Node("rep", self.s[start:self.i], [atom], lo, hi, width)

    def atom(self) -> Node:
        start, c = self.i, self._peek()
        if c == "(":
            return self._group()
        if c == "[":
            self._class()
        elif c == "\\":
            self._escape()
        elif c in "^$*+?{|)":
            raise Unfoldable(f"{c!r} at {start} where a character was expected")
        else:
            self.i += 1  # '.' or a literal code point
        return Node("atom", self.s[start:self.i])

    def _group(self) -> Node:
        start = self.i
        self.i += 1
        if self.s.startswith("?:", self.i):
            self.i += 2
        elif self._peek() == "?":
            raise Unfoldable("lookarounds, inline flags and named groups are not folded")
        inner = self.alternation()
        if self._peek() != ")":
            raise Unfoldable("unclosed group")
        self.i += 1
        return Node("group", self.s[start:self.i], [inner], width=inner.width)

    def _class(self) -> None:
        self.i += 1
        if self._peek() == "^":
            self.i += 1
        if self._peek() == "]":
            raise Unfoldable("a class starting with ']' differs between regex dialects")
        while self._peek() != "]":
            if self._peek() == "":
                raise Unfoldable("unclosed character class")
            if self._peek() == "[":
                raise Unfoldable("'[' inside a class differs between regex dialects")
            if self._peek() == "\\":
                self._escape()
            else:
                self.i += 1
        self.i += 1

    def _escape(self) -> None:
        c = self._peek(1)
        if c in ("x", "u"):
            n = 2 if c == "x" else 4
            digits = self.s[self.i + 2:self.i + 2 + n]
            if len(digits) != n or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise Unfoldable(f"escape \\{c} needs {n} hex digits")
            self.i += 2 + n
        elif c in _CLASS_ESCAPES or (c and not c.isalnum() and c.isascii()):
            self.i += 2  # a class like \\d, or a punctuation character taken literally
        else:
            raise Unfoldable(f"escape \\{c} is not folded")

    def _peek(self, ahead: int = 0) -> str:
        j = self.i + ahead
        return self.s[j] if j < len(self.s) else ""


def _seq(text: str, items: list[Node]) -> Node:
    if len(items) == 1 and items[0].text == text:
        return items[0]
    his = [n.width[1] for n in items]
    return Node("seq", text, items,
                width=(sum(n.width[0] for n in items), None if None in his else sum(his)))
