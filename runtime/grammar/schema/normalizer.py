"""``normalize_schema``: a JSON Schema (draft-04..2020-12) rewritten into the plain subset the
grammar backends enforce exactly (see the package doc), or rejected naming keyword and path.

The normal form: a schema is a *plain* object (no ``$ref`` except to a recursive definition, no
``allOf``/``if``/``not``/``dependent*``), or ``{"anyOf": [plain, ...]}``, or ``false`` where a
keyword allows it. Each node is normalized bottom-up: its children first, then its ``$ref`` and
``allOf`` merged in, then every alternative list (``anyOf``, ``oneOf``, conditionals,
dependencies) multiplied out against the rest of the node, and each resulting branch checked
(``finalize``). The rewrites only ever narrow: every instance of the result is one of the
original (unit-tested with jsonschema, both ways where exact).
"""
from __future__ import annotations

import itertools
import json
from typing import Any

from .drafts import to_2020_12
from .emit import emit
from .lengths import mark_lengths
from .finalize import finalize
from .merge import merge_plain
from .conditional import dependencies, if_then_else
from .negation import exactly_normalized, negate, negate_raw
from .oneof import make_exclusive
from .refs import RefTable
from .strings import spell_assertions
from .subsume import drop_subsumed
from .support import check_schema_support
from .lenient import without_repeats
from .rejection import Impossible, keyword_at, reject
from .tuning import tune_for_backend

MAX_NODES = 20_000  # subschemas visited (inlined references repeat theirs)
MAX_BRANCHES = 64  # anyOf branches one node may multiply out to
MAX_MERGED_DEFS = 32  # definitions made for recursive references met with other keywords
_COMBINATORS = ("allOf", "anyOf", "oneOf", "if", "then", "else", "not", "dependentRequired",
                "dependentSchemas", "$ref", "$defs", "definitions")
_NAMED = ("properties", "patternProperties")
_SINGLE = ("additionalProperties", "items", "propertyNames", "contains")


def normalize_schema(schema: Any, backend_name: str = "xgrammar") -> dict:
    """The normal form of ``schema`` (a dict, ready to dump for ``backend_name``).

    Raises ``InvalidRequestError(field="json_schema")`` naming the keyword and JSON path of
    what cannot be enforced, or saying the schema has no valid instance."""
    schema = without_repeats(schema)  # served once each, not rejected (lenient.py)
    norm = _Normalizer(schema)
    try:
        out = norm.schema(schema, "#")
        norm.finish_merges()
        defs = {name: emit(d, f"#/$defs/{name}") for name, d in norm.defs.items()}
        out = emit(out, "#")
    except Impossible as e:
        raise reject(e.keyword, e.path, f"no instance can satisfy it: {e.why}") from None
    if out is False:
        raise reject("false", "#", "no instance can satisfy it")
    if defs:
        out = {**out, "$defs": defs}
    out = tune_for_backend(mark_lengths(out, backend_name), backend_name)
    check_schema_support(backend_name, out)
    return out


class _Normalizer:
    def __init__(self, root: Any) -> None:
        self.refs = RefTable(root)
        self.defs: dict[str, Any] = {}
        self._building: set[str] = set()  # definitions being normalized (may reference selves)
        self._merged: dict[tuple[str, str], str] = {}  # (definition, other keywords) -> name
        self._pending: list[tuple[str, str, dict, str]] = []  # merges still to fill in
        self.nodes = 0

    # -- one node -------------------------------------------------------------------------------
    def schema(self, node: Any, path: str, context: dict | None = None) -> Any:
        """The normal form of ``node`` (raises Impossible if it has no instance). ``context``:
        what an enclosing ``allOf`` already demands (negations may rely on it)."""
        if node is True:
            return {}
        if node is False:
            raise Impossible(path, "the schema is false", "false")
        if not isinstance(node, dict):
            keyword, _ = keyword_at(path.split("/")[1:])
            raise reject(keyword, path, "a schema must be an object or a boolean")
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise reject("$ref", path, f"the schema has over {MAX_NODES} subschemas once its "
                                       "references are inlined")
        node = to_2020_12(node)
        own = self._children({k: v for k, v in node.items() if k not in _COMBINATORS}, path)
        out = finalize(own, path, self.sub)
        if "$ref" in node:
            out = self.sub(self._ref(node["$ref"], path), out, path)
        inner = _with_context(_plain(out), context)  # before allOf turns it into an anyOf
        for i, branch in enumerate(node.get("allOf") or []):
            out = self.sub(out, self.schema(branch, f"{path}/allOf/{i}", inner), path)
        return self._alternatives(node, out, path, inner)

    def _children(self, node: dict, path: str) -> dict:
        out = dict(node)
        for key in _NAMED:
            if isinstance(node.get(key), dict):
                out[key] = {name: self.optional(sub, f"{path}/{key}/{name}")
                            for name, sub in node[key].items()}
        if isinstance(out.get("patternProperties"), dict):  # backends ignore lookarounds
            out["patternProperties"] = {
                spell_assertions(p, f"{path}/patternProperties"): sub
                for p, sub in out["patternProperties"].items()}
        for key in _SINGLE:
            if key in node:
                out[key] = self.optional(node[key], f"{path}/{key}")
        if isinstance(node.get("prefixItems"), list):
            out["prefixItems"] = [self.optional(s, f"{path}/prefixItems/{i}")
                                  for i, s in enumerate(node["prefixItems"])]
        return out

    def optional(self, node: Any, path: str) -> Any:
        """A child that may be impossible: ``False`` then (the parent decides what that means)."""
        try:
            return self.schema(node, path)
        except Impossible:
            return False

    def _ref(self, ref: Any, path: str) -> Any:
        if not isinstance(ref, str):
            raise reject("$ref", path, "$ref must be a string")
        target = self.refs.resolve(ref, path)
        if not self.refs.is_recursive(ref, path):
            return self.schema(target, ref)
        name = self.refs.def_name(ref)
        if name not in self.defs:
            self.defs[name] = {}  # placeholder: the definition references itself
            self._building.add(name)
            try:
                self.defs[name] = self.schema(target, ref)
            finally:
                self._building.discard(name)
        return {"$ref": f"#/$defs/{name}"}

    # -- alternatives ---------------------------------------------------------------------------
    def _alternatives(self, node: dict, out: Any, path: str, context: dict | None) -> Any:
        lists: list[tuple[str, list]] = []
        known = _with_context(_plain(out), context)  # the node's own keywords first
        for key in ("anyOf", "oneOf"):
            if isinstance(node.get(key), list):
                lists.append((key, [self.optional(b, f"{path}/{key}/{i}")
                                    for i, b in enumerate(node[key])]))
        if "if" in node:
            cond = self.optional(node["if"], f"{path}/if")
            then = self.optional(node["then"], f"{path}/then") if "then" in node else None
            other = self.optional(node["else"], f"{path}/else") if "else" in node else None
            if then is not None or other is not None:
                negated = self._negation(node["if"], f"{path}/if", known, cond)
                lists.append(("if", if_then_else(cond, then, other, negated)))
        if "not" in node:
            negated = self._negation(node["not"], f"{path}/not", known)
            if negated is None:
                raise reject("not", path, "only types, enums, bounds, properties/required, "
                                          "anyOf of those, and a one-class pattern can be "
                                          "negated")
            lists.append(("not", negated))
        deps: dict = {}
        if isinstance(node.get("dependentRequired"), dict):
            deps["dependentRequired"] = node["dependentRequired"]
        if isinstance(node.get("dependentSchemas"), dict):
            deps["dependentSchemas"] = {
                name: self.optional(s, f"{path}/dependentSchemas/{name}")
                for name, s in node["dependentSchemas"].items()}
        lists += dependencies(deps)
        for key, alts in lists:
            out = self._distribute(out, key, alts, path)
        return out

    def _negation(self, raw: Any, path: str, context: dict, normal: Any = None) -> list | None:
        """Alternatives exactly equal to ``not raw`` within ``context``, or None. Read as
        written where that is simpler; else from the normal form (``normal``, if known), only
        when that is exact (the complement of a narrowed schema would be wider)."""
        positive = negate_raw(raw)
        if positive is not None:  # used as alternatives: narrowing them is sound
            return [self.optional(p, path) for p in positive]
        if not exactly_normalized(raw, lambda ref: self.refs.resolve(ref, path)):
            return None
        normal = self.optional(raw, path) if normal is None else normal
        return negate(normal, context, lambda a, b: self.sub(a, b, path))

    def _distribute(self, out: Any, key: str, alts: list, path: str) -> Any:
        """``out`` and one of ``alts`` (an anyOf of each pair that has instances)."""
        branches = []
        for left, right in itertools.product(_branches(out), alts):
            try:
                both = self.sub(left, self._lazy(right, path), path)
            except Impossible:
                continue
            if both is not False:  # an impossible branch is dropped, never sent on
                branches.extend(_branches(both))
        if key == "oneOf":  # exclusive first: a branch inside another still excludes it
            self._check_count(branches, key, path)  # make_exclusive is quadratic
            branches, _ = make_exclusive(branches)
        branches = drop_subsumed(_dedupe(branches))
        self._check_count(branches, key, path)
        if not branches:
            raise Impossible(path, f"no {key} alternative is satisfiable with its siblings", key)
        return branches[0] if len(branches) == 1 else {"anyOf": branches}

    @staticmethod
    def _check_count(branches: list, key: str, path: str) -> None:
        if len(branches) > MAX_BRANCHES:
            raise reject(key, path, f"it multiplies out to over {MAX_BRANCHES} alternatives")

    def _lazy(self, alt: Any, path: str) -> Any:
        """Resolve the conditional module's ("allOf", a, b) pairs by merging."""
        if isinstance(alt, tuple):
            return self.sub(self._lazy(alt[1], path), self._lazy(alt[2], path), path)
        return alt

    # -- merging ----------------------------------------------------------------------------------
    def sub(self, a: Any, b: Any, path: str) -> Any:
        """The intersection of two normal forms (False when one is)."""
        if a is False or b is False:
            return False
        if a == {}:
            return b
        if b == {}:
            return a
        if "anyOf" in a or "anyOf" in b:
            return self._distribute(a, "anyOf", _branches(b), path)
        if "$ref" in a or "$ref" in b:
            return self._merge_ref(a, b, path)
        return finalize(merge_plain(a, b, path, self.sub), path, self.sub)


    def _merge_ref(self, a: dict, b: dict, path: str) -> Any:
        """A recursive reference met with other keywords: its definition merged in one level
        deep (exact: the reference means its definition; its own inner references stay). A
        merge with alternatives becomes a definition of its own, shared by every place that
        makes the same merge (inlined, a meta-schema's 16 branches went in at each of 8
        places). Inside its own definition (still being built) the merge waits: the result
        refers to a new definition that ``finish_merges`` fills in once every one is known."""
        ref, other = (a, b) if "$ref" in a else (b, a)
        name = ref["$ref"].rsplit("/", 1)[-1]
        key = (name, json.dumps(other, sort_keys=True, default=str))
        if key in self._merged:
            return {"$ref": f"#/$defs/{self._merged[key]}"}
        target = self.defs.get(name)
        if name in self._building or target is None:
            self._pending.append((self._new_merge(key, path), name, other, path))
            return {"$ref": f"#/$defs/{self._merged[key]}"}
        merged = self.sub(target, other, path)
        if not isinstance(merged, dict) or "anyOf" not in merged:
            return merged
        self.defs[self._new_merge(key, path)] = merged
        return {"$ref": f"#/$defs/{self._merged[key]}"}

    def _new_merge(self, key: tuple[str, str], path: str) -> str:
        if len(self._merged) >= MAX_MERGED_DEFS:
            raise reject("$ref", path, f"over {MAX_MERGED_DEFS} recursive $refs combined with "
                                       "other keywords")
        self._merged[key] = f"{key[0]}m{len(self._merged)}"
        return self._merged[key]

    def finish_merges(self) -> None:
        """The definitions ``_merged_ref`` promised (each may promise more)."""
        while self._pending:
            new, name, other, path = self._pending.pop(0)
            try:
                self.defs[new] = self.sub(self.defs[name], other, path)
            except Impossible:
                self.defs[new] = False
            if self.defs[new] is False:  # too late to drop what refers to it
                raise reject("$ref", path, "a recursive $ref combined with other keywords "
                                           "inside its own definition has no instance")


def _branches(node: Any) -> list:
    return list(node["anyOf"]) if isinstance(node, dict) and "anyOf" in node else [node]


def _plain(node: Any) -> dict:
    return node if isinstance(node, dict) and "anyOf" not in node else {}


def _with_context(own: dict, context: dict | None) -> dict:
    """``own`` plus the property schemas an enclosing schema gives (for negation domains)."""
    if not context:
        return own
    props = {**context.get("properties", {}), **own.get("properties", {})}
    return {**context, **own, "properties": props}


def _dedupe(branches: list) -> list:
    seen, out = set(), []
    for b in branches:
        key = json.dumps(b, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            out.append(b)
    return out


