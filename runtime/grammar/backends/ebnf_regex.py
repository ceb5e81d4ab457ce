"""Lower a regular (non-recursive) GBNF grammar to a regex, for regex-only backends (outlines).

GBNF (llama.cpp's EBNF): ``name ::= expr`` rules, ``|`` alternation, ``( )`` groups, ``* + ?``
and ``{m}``/``{m,}``/``{m,n}`` repetition, ``"literals"``, ``[classes]``, ``.``, ``#`` comments.
A grammar whose rules reference each other in a cycle is context-free, not regular: it is
rejected with an ``InvalidRequestError`` that says so (xgrammar handles those).
"""
from __future__ import annotations

import re
from typing import Union

from ...errors import InvalidRequestError

Node = Union[tuple, str]
_NAME = re.compile(r"[A-Za-z0-9_-]+")
_ESC = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "]": "]", "[": "[", "-": "-",
        "^": "^", "/": "/", "'": "'"}
_META = set("\\.^$|?*+()[]{}")


class _Parser:
    """Recursive descent over the grammar text; ``pos`` is the cursor."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, msg: str) -> None:
        raise InvalidRequestError(f"ebnf parse error at offset {self.pos}: {msg}", field="ebnf")

    def skip(self) -> None:
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c == "#":
                end = self.text.find("\n", self.pos)
                self.pos = len(self.text) if end < 0 else end
            elif c.isspace():
                self.pos += 1
            else:
                return

    def rules(self) -> dict[str, Node]:
        rules: dict[str, Node] = {}
        self.skip()
        while self.pos < len(self.text):
            m = _NAME.match(self.text, self.pos)
            if not m:
                self.fail("expected a rule name")
            self.pos = m.end()
            self.skip()
            if not self.text.startswith("::=", self.pos):
                self.fail(f"expected '::=' after {m.group(0)!r}")
            self.pos += 3
            if m.group(0) in rules:
                self.fail(f"rule {m.group(0)!r} is defined twice")
            rules[m.group(0)] = self.alternation()
            self.skip()
        return rules

    def at_rule_start(self) -> bool:
        m = _NAME.match(self.text, self.pos)
        return bool(m) and self.text.startswith("::=", _skip_ws(self.text, m.end()))

    def alternation(self) -> Node:
        options = [self.sequence()]
        while self.pos < len(self.text) and self.text[self.pos] == "|":
            self.pos += 1
            options.append(self.sequence())
        return ("alt", options) if len(options) > 1 else options[0]

    def sequence(self) -> Node:
        items: list[Node] = []
        while True:
            self.skip()
            if self.pos >= len(self.text) or self.text[self.pos] in "|)" or self.at_rule_start():
                return ("seq", items)
            items.append(self.postfix(self.atom()))

    def atom(self) -> Node:
        c = self.text[self.pos]
        if c == "(":
            self.pos += 1
            inner = self.alternation()
            self.skip()
            if self.pos >= len(self.text) or self.text[self.pos] != ")":
                self.fail("missing ')'")
            self.pos += 1
            return inner
        if c in "\"'":
            return ("lit", self.literal(c))
        if c == "[":
            return ("cls", self.char_class())
        if c == ".":
            self.pos += 1
            return ("cls", "[\\s\\S]")
        m = _NAME.match(self.text, self.pos)
        if not m:
            self.fail(f"unexpected character {c!r}")
        self.pos = m.end()
        return ("ref", m.group(0))

    def postfix(self, node: Node) -> Node:
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c in "*+?":
                self.pos += 1
                node = ("rep", node, {"*": (0, None), "+": (1, None), "?": (0, 1)}[c])
            elif c == "{":
                m = re.compile(r"\{\s*(\d+)\s*(,\s*(\d*)\s*)?\}").match(self.text, self.pos)
                if not m:
                    self.fail("bad repetition")
                self.pos = m.end()
                hi = int(m.group(1)) if not m.group(2) else (int(m.group(3)) if m.group(3) else None)
                node = ("rep", node, (int(m.group(1)), hi))
            else:
                return node
        return node

    def char(self) -> str:
        if self.pos + 1 > len(self.text) or (self.text[self.pos] == "\\"
                                             and self.pos + 2 > len(self.text)):
            self.fail("unterminated string literal or character class")
        c = self.text[self.pos]
        self.pos += 1
        if c != "\\":
            return c
        e = self.text[self.pos]
        self.pos += 1
        if e in "xuU":
            n = {"x": 2, "u": 4, "U": 8}[e]
            digits = self.text[self.pos:self.pos + n]
            self.pos += n
            try:
                return chr(int(digits, 16))
            except ValueError:
                self.fail(f"bad escape \\{e}{digits}")
        if e not in _ESC:
            self.fail(f"unknown escape \\{e}")
        return _ESC[e]

    def literal(self, quote: str) -> str:
        self.pos += 1
        out = []
        while self.pos < len(self.text) and self.text[self.pos] != quote:
            out.append(self.char())
        if self.pos >= len(self.text):
            self.fail("unterminated string literal")
        self.pos += 1
        return "".join(out)

    def char_class(self) -> str:
        self.pos += 1
        negate = self.text.startswith("^", self.pos)
        self.pos += int(negate)
        parts = []
        while self.pos < len(self.text) and self.text[self.pos] != "]":
            lo = self.char()
            if self.text.startswith("-", self.pos) and not self.text.startswith("-]", self.pos):
                self.pos += 1
                parts.append(_class_char(lo) + "-" + _class_char(self.char()))
            else:
                parts.append(_class_char(lo))
        if self.pos >= len(self.text):
            self.fail("unterminated character class")
        self.pos += 1
        return "[" + ("^" if negate else "") + "".join(parts) + "]"


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t":
        pos += 1
    return pos


def _escape_char(c: str) -> str:
    if ord(c) < 0x20 or ord(c) == 0x7F:
        return f"\\x{ord(c):02x}"
    return "\\" + c if c in _META else c


def _class_char(c: str) -> str:
    if c in "\\]^-[&~":
        return "\\" + c
    return _escape_char(c)


def ebnf_to_regex(text: str, root: str = "root") -> str:
    """The regex matching exactly the language of a non-recursive GBNF grammar."""
    rules = _Parser(text).rules()
    if root not in rules:
        raise InvalidRequestError(f"ebnf has no {root!r} rule", field="ebnf")
    done: dict[str, str] = {}

    def emit(node: Node, stack: tuple[str, ...]) -> str:
        kind = node[0]
        if kind == "lit":
            return "".join(_escape_char(c) for c in node[1])
        if kind == "cls":
            return node[1]
        if kind == "seq":
            return "".join(emit(n, stack) for n in node[1])
        if kind == "alt":
            return "(" + "|".join(emit(n, stack) for n in node[1]) + ")"
        if kind == "rep":
            lo, hi = node[2]
            quant = {(0, None): "*", (1, None): "+", (0, 1): "?"}.get((lo, hi))
            quant = quant or ("{%d,}" % lo if hi is None else "{%d,%d}" % (lo, hi))
            return "(" + emit(node[1], stack) + ")" + quant
        return ref(node[1], stack)

    def ref(name: str, stack: tuple[str, ...]) -> str:
        if name in stack:
            raise InvalidRequestError(
                f"ebnf rule {name!r} is recursive ({' -> '.join(stack + (name,))}); this grammar "
                "backend supports only regular (non-recursive) grammars: use xgrammar",
                field="ebnf")
        if name not in rules:
            raise InvalidRequestError(f"ebnf references undefined rule {name!r}", field="ebnf")
        if name not in done:
            done[name] = "(" + emit(rules[name], stack + (name,)) + ")"
        return done[name]

    return ref(root, ())
