"""String length bounds the runtime enforces instead of the grammar (``LENGTH_MARK``).

Both backends compile a length bound by unrolling it: xgrammar took 0.06 s for
``{"type": "string", "maxLength": 8}``, 0.25 s at 32, 1.2 s at 128 and ~2 s at any bound from
256 up (minLength alike), outlines 0.95 s at 256, against 4-7 ms for a plain string; each
distinct bound pays again, so schemas with several missed the compile deadline on a loaded box.
A plain string whose bound exceeds ``GRAMMAR_MAX`` (see there why 128) therefore reaches the backend without its
``minLength``/``maxLength`` and carries ``LENGTH_MARK: [lo, hi]`` (``hi`` None: no upper
bound) instead; ``grammar/guards/string_chars.py`` counts the characters of the open string and masks
the tokens that would break the bound. So does a ``pattern`` whose length bounds cannot be
folded into it (``strings.py`` leaves those bounds beside it, ``UNFOLDED``), and, while the
bounds a schema keeps in the grammar sum past ``GRAMMAR_BUDGET``, its largest ones.

The runtime finds a string's bound from the schema candidates of its position
(``json_track.py``: the ``anyOf`` branches and ``$ref`` targets it may be an instance of) and
takes the loosest bound over those that admit strings. That is exact only when one candidate
alone admits strings, so a bound is marked only where no sibling branch admits strings too,
and never at the root of a definition (a ``$ref`` may use it anywhere) nor under
``propertyNames``; elsewhere it stays in the grammar.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from .pattern_length import fold_lengths, largest_count
from .patterns import Unfoldable
from .rejection import reject

# Bounds up to this stay in the grammar (``tuning.py`` spells them as a pattern for xgrammar):
# they compile in 0.06 s (17) to 0.6 s (128) and fill a row in ~8 us, where a row under the
# runtime's count costs ~30-60 us of Python per token on the scheduler thread (256 rows of a
# 5-field schema: 6 -> 14-21 ms of grammar work per step with 16 here). Above it xgrammar either
# compiles for ~2 s or, as a pattern, fills a row in ~11 ms (a 256-bound pattern, measured).
GRAMMAR_MAX = 128
# Bounded counts one schema keeps in the grammar at most, summed over its distinct bounds: past
# it the largest markable ones are counted at runtime too. xgrammar builds mask tables per
# counted position, so compile time grows with the sum: a schema with two 100-character
# strings (Github_easy__o1327) compiled for 5.6 s where its raw form took 0.02 s (raw xgrammar
# enforces neither: they sit under allOf/not; benchmarks/RESULTS.md, "Compile once"). One
# string up to GRAMMAR_MAX stays in the grammar as before (raw xgrammar's own maxLength costs
# as much), and so does the 5-field person schema (24 + 20).
GRAMMAR_BUDGET = GRAMMAR_MAX
# Per backend, (the largest bound one string keeps in the grammar, the budget of their sum):
# outlines-core builds its index by walking the vocabulary through every counted position: a
# string's maxLength 16 took 0.83 s, 32 1.3 s and 80 12-15 s to index, against 0.37 s unbounded
# (loaded 2-core box, 2026-11-28; the e2e suite's obj_math_answer compiled for 85 s there),
# where xgrammar took 0.6 s at 128.
_BACKEND_LIMITS = {"outlines": (16, 32)}
# Marks a string whose length bounds the runtime enforces (backends ignore x- keys).
LENGTH_MARK = "x-sgdsl-length"
# Set by ``strings.py`` on a pattern whose length bounds it could not fold (True), or could
# only fold into large counts (the folded pattern: used where the runtime cannot count): the
# bounds stay beside the pattern until ``mark_lengths`` marks them, folds or rejects.
UNFOLDED = "x-sgdsl-unfolded"
_BOUNDS = ("minLength", "maxLength")


@dataclass
class _Plan:
    """Which bounds ``_marked`` must mark beyond the large ones (``force``: paths), and, on a
    dry run, the bounds it kept in the grammar: (count, path, may be marked, how the grammar
    spells them)."""

    force: frozenset = frozenset()
    kept: list | None = None
    grammar_max: int = GRAMMAR_MAX


def grammar_limits(backend: str) -> tuple[int, int]:
    """(``GRAMMAR_MAX``, ``GRAMMAR_BUDGET``) for ``backend``."""
    return _BACKEND_LIMITS.get(backend, (GRAMMAR_MAX, GRAMMAR_BUDGET))


def mark_lengths(root: Any, backend: str = "xgrammar") -> Any:
    """``root`` (a normal form) with large string length bounds marked for the runtime, and
    the largest others too while the bounds left in the grammar exceed the budget
    (``grammar_limits(backend)``)."""
    if not isinstance(root, dict):
        return root
    grammar_max, budget = grammar_limits(backend)
    dry = _Plan(kept=[], grammar_max=grammar_max)
    _mark_all(root, dry)
    # NOTE: equal bounds compile once (``sharing.py`` makes them one definition): a group
    # counts once, and is counted at runtime whole or not at all
    groups: dict = {}
    for count, path, markable, spelled in dry.kept:
        group = groups.setdefault(spelled, [count, [], True])
        group[1].append(path)
        group[2] = group[2] and markable
    total = sum(g[0] for g in groups.values())
    force: set[str] = set()
    for count, paths, markable in sorted(groups.values(), key=lambda g: -g[0]):
        if total <= budget:
            break
        if markable:
            force.update(paths)
            total -= count
    return _mark_all(root, _Plan(frozenset(force), grammar_max=grammar_max))


def _mark_all(root: dict, plan: _Plan) -> dict:
    out = _mark(root, "#", True, plan)
    if isinstance(root.get("$defs"), dict):
        out["$defs"] = {name: _mark(d, f"#/$defs/{name}", False, plan)
                        for name, d in root["$defs"].items()}
    return out


def _mark(node: Any, path: str, alone: bool, plan: _Plan) -> Any:
    """``node`` marked where it may be; ``alone``: no other candidate of its position admits
    strings (see the module doc)."""
    if not isinstance(node, dict):
        return node
    out = dict(node)
    if isinstance(node.get("anyOf"), list):
        solo = alone and sum(map(admits_string, node["anyOf"])) <= 1
        out["anyOf"] = [_mark(b, f"{path}/anyOf/{i}", solo, plan)
                        for i, b in enumerate(node["anyOf"])]
    for key in ("properties", "patternProperties"):
        if isinstance(node.get(key), dict):
            # NOTE: every pattern a key matches applies (an intersection), the runtime would
            # take the loosest: one pattern only
            one = key == "properties" or len(node[key]) == 1
            out[key] = {k: _mark(s, f"{path}/{key}/{k}", one, plan)
                        for k, s in node[key].items()}
    for key in ("additionalProperties", "items"):
        if key in node:
            out[key] = _mark(node[key], f"{path}/{key}", True, plan)
    if isinstance(node.get("prefixItems"), list):
        out["prefixItems"] = [_mark(s, f"{path}/prefixItems/{i}", True, plan)
                              for i, s in enumerate(node["prefixItems"])]
    return _marked(out, path, alone, plan)


def _marked(node: dict, path: str, alone: bool, plan: _Plan) -> dict:
    """One node: its bounds as ``LENGTH_MARK`` where that is allowed and worth it."""
    unfolded = node.pop(UNFOLDED, None)
    if not any(k in node for k in _BOUNDS) or "string" not in _types(node):
        return node
    lo, hi = node.get("minLength", 0), node.get("maxLength")
    plain = not any(k in node for k in ("pattern", "format", "enum", "const"))
    # the largest count the grammar would unroll for these bounds
    count = largest_count(unfolded) if isinstance(unfolded, str) else \
        (hi if hi is not None else lo) if plain else 0
    if alone and (unfolded is True or count > plan.grammar_max or path in plan.force):
        out = {k: v for k, v in node.items() if k not in _BOUNDS}
        out[LENGTH_MARK] = [lo, hi]
        return out
    if plan.kept is not None and count:
        spelled = unfolded if isinstance(unfolded, str) else (lo, hi)
        plan.kept.append((count, path, alone, spelled))
    if isinstance(unfolded, str):  # the fold, slow to compile but exact (strings.py)
        out = {k: v for k, v in node.items() if k not in _BOUNDS}
        out["pattern"] = unfolded
        return out
    if unfolded:
        raise reject("maxLength" if hi is not None else "minLength", path,
                     f"length bounds beside this pattern cannot be folded into it "
                     f"({_why_unfoldable(node['pattern'], lo, hi)}), nor counted at runtime "
                     "where another candidate also admits strings")
    return node


def _why_unfoldable(pattern: str, lo: int, hi: int | None) -> str:
    try:
        fold_lengths(pattern, lo, hi)
    except Unfoldable as e:
        return str(e)
    return "unknown"


def admits_string(node: Any) -> bool:
    """Whether a normal-form node may take a string value (a ``$ref``: assumed so)."""
    if not isinstance(node, dict):
        return node is not False
    if isinstance(node.get("anyOf"), list):
        return any(admits_string(b) for b in node["anyOf"])
    if "$ref" in node:
        return True
    for key in ("enum", "const"):
        if key in node:
            values = node[key] if key == "enum" else [node[key]]
            return any(isinstance(v, str) for v in values)
    return "string" in _types(node)


def _types(node: dict) -> tuple:
    types = node.get("type")
    if types is None:
        return ("string",)  # untyped: any value
    return (types,) if isinstance(types, str) else tuple(types)


def string_bound(cands: Iterable[dict]) -> tuple[int, int | None, str | None] | None:
    """The runtime bound (lo, hi, the pattern beside it) of a string at a position with schema
    candidates ``cands``: the loosest over those that admit strings (an unmarked one: none;
    the pattern only where one candidate alone is marked); None if unbounded."""
    lo, hi, patterns = None, -1, []
    for c in cands:
        if "anyOf" in c or "$ref" in c or not admits_string(c):
            continue
        mark = c.get(LENGTH_MARK)
        c_lo, c_hi = (mark[0], mark[1]) if mark else (0, None)
        patterns.append(c.get("pattern") if mark else None)
        lo = c_lo if lo is None else min(lo, c_lo)
        hi = None if hi is None or c_hi is None else max(hi, c_hi)
    if not patterns or (lo == 0 and hi is None):
        return None
    return lo, hi, patterns[0] if len(patterns) == 1 else None


def smallest_bound(root: Any) -> int | None:
    """The smallest upper bound ``root`` marks (a mark without one counts as unbounded: a
    large number); None if it marks none."""
    found: list[int] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            mark = node.get(LENGTH_MARK)
            if isinstance(mark, list) and len(mark) == 2:
                found.append(1 << 62 if mark[1] is None else int(mark[1]))
            for k, v in node.items():
                if k not in ("enum", "const", LENGTH_MARK):
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(root)
    return min(found) if found else None
