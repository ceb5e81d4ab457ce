"""Strings for property tests of regex rewrites: sampled from a pattern's parse (repeat counts
running up to a reach, so lengths pass any bound under test) and mutated by one character."""
from __future__ import annotations

import random
import re

from sgdsl.runtime.grammar.schema.patterns import Node, parse_pattern

ALPHABET = ([chr(c) for c in range(1, 127)] + ["é", "ж", "中", "\u2028"])


def _chars(atom: str) -> list[str]:
    return [c for c in ALPHABET if re.fullmatch(atom, c, re.DOTALL if atom == "." else 0)]


def _sample(node: Node, rng: random.Random, reach: int) -> str:
    """A string that ``node`` should fully match, repeats running up to ``reach`` times."""
    if node.kind == "atom":
        return rng.choice(_chars(node.text) or ["\x00"])
    if node.kind in ("group", "seq"):
        return "".join(_sample(c, rng, reach) for c in node.children)
    if node.kind == "alt":
        return _sample(rng.choice(node.children), rng, reach)
    hi = node.hi if node.hi is not None else node.lo + reach
    k = rng.choice([node.lo, hi, rng.randint(node.lo, hi)])
    return "".join(_sample(node.children[0], rng, reach) for _ in range(k))


def _mutations(s: str, rng: random.Random) -> list[str]:
    i = rng.randint(0, len(s))
    c = rng.choice(ALPHABET)
    return [s[:i] + c + s[i:], s[:i] + s[i + 1:], s + s[-1:], s[:-1], s + c]


def candidates(pattern: str, folded: str, reach: int, seed: int) -> set[str]:
    rng = random.Random(seed)
    trees = [parse_pattern(pattern), parse_pattern(folded)]
    out: set[str] = set()
    for _ in range(400):
        s = _sample(rng.choice(trees), rng, reach)
        out.add(s)
        out.update(_mutations(s, rng))
    return out


