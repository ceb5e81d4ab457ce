"""Size limits checked before a grammar is compiled.

Compilation is native code that cannot be interrupted, so the cheap checks here reject the inputs
that would make it explode (huge texts, deep nesting, huge repetition bounds) before any worker
thread is spent; the compile deadline in ``compiler.py`` catches whatever slips through.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ...errors import InvalidRequestError
from ..base import GrammarKey
from ..schema.rejection import keyword_at

# {n}, {n,}, {n,m} quantifiers not preceded by a backslash.
_REPEAT = re.compile(r"(?<!\\)\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")
_BOUND_KEYS = ("minItems", "maxItems", "minLength", "maxLength", "minProperties",
               "maxProperties", "minContains", "maxContains")


@dataclass(frozen=True)
class GrammarLimits:
    """Upper bounds on what a request may ask the compiler to build."""

    max_text_bytes: int = 64 * 1024
    max_json_depth: int = 24  # nesting of the schema document itself
    max_repetition: int = 1024  # any {n,m} bound in a regex/EBNF/pattern
    # NOTE: xgrammar compiles any JSON-schema length/count bound in ~1-4 s (maxLength 100000:
    # 4 s); outlines-core's limit is lower and checked in schema/support.py.
    max_schema_bound: int = 100_000  # minItems/maxLength... in a json_schema
    max_choices: int = 4096

    def check(self, key: GrammarKey, meta: bool = True) -> None:
        """Raise ``InvalidRequestError(field=key.field)`` naming the broken limit. ``meta``:
        also check a JSON schema against the meta-schema (``check_meta_schema``: jsonschema
        takes 20-300 ms on a large schema; the compiler leaves it to the worker)."""
        size = len(key.text.encode("utf-8", "surrogatepass"))
        if size > self.max_text_bytes:
            _fail(key, f"{key.field} is {size} bytes; the limit is {self.max_text_bytes}")
        if key.kind == "json_schema":
            self._check_schema(key, meta)
        elif key.kind in ("regex", "ebnf"):
            self._check_repetition(key, key.text)
        elif key.kind == "choices" and len(json.loads(key.text)) > self.max_choices:
            _fail(key, f"at most {self.max_choices} choices are allowed")

    def _check_repetition(self, key: GrammarKey, text: str, where: str = "") -> None:
        for m in _REPEAT.finditer(text):
            for bound in m.groups():
                if bound and int(bound) > self.max_repetition:
                    _fail(key, f"repetition bound {{{m.group(0)[1:-1]}}} exceeds the limit "
                               f"of {self.max_repetition}{where}")

    def _check_schema(self, key: GrammarKey, meta: bool) -> None:
        try:
            schema = json.loads(key.text)
        except (ValueError, RecursionError) as e:
            _fail(key, f"json_schema is not valid JSON: {e}")
        if not isinstance(schema, (dict, bool)):
            _fail(key, "json_schema must be a JSON object (or a boolean)")
        self._walk(key, schema, [])
        if meta:
            _check_meta_schema(key, schema)

    def _walk(self, key: GrammarKey, node: Any, parts: list) -> None:
        if len(parts) >= self.max_json_depth:
            _fail(key, f"json_schema nesting depth exceeds the limit of {self.max_json_depth} "
                       f"({_where(parts)})")
        if isinstance(node, dict):
            for k, v in node.items():
                if k in _BOUND_KEYS and isinstance(v, (int, float)) and v > self.max_schema_bound:
                    _fail(key, f"json_schema {k}={v} exceeds the limit of "
                               f"{self.max_schema_bound} ({_where(parts + [k])})")
                if k == "pattern" and isinstance(v, str):
                    self._check_repetition(key, v, f" ({_where(parts + [k])})")
                self._walk(key, v, parts + [k])
        elif isinstance(node, list):
            for i, v in enumerate(node):
                self._walk(key, v, parts + [i])


def check_meta_schema(key: GrammarKey) -> None:
    """The meta-schema check of a ``json_schema`` key alone (a compile worker runs it beside
    the compile; ``check`` has passed)."""
    if key.kind == "json_schema":
        _check_meta_schema(key, json.loads(key.text))


def _check_meta_schema(key: GrammarKey, schema: Any) -> None:
    """Reject schemas that break the JSON Schema meta-schema (e.g. ``"type": 5``), naming the
    keyword and where it is. Repeated ``enum``/``required``/``type`` values are harmless and
    pass (``schema/lenient.py``)."""
    try:
        import jsonschema
    except ImportError:  # optional: the backends still reject what they cannot parse
        return
    from ..schema.lenient import without_repeats
    from ..schema.validator import validator_class

    schema = without_repeats(schema)
    try:
        validator_class(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        keyword, where = keyword_at(list(e.absolute_path))
        _fail(key, f"json_schema is not a valid JSON Schema: keyword {keyword!r} at {where}: "
                   f"{e.message}")
    except RecursionError:
        _fail(key, "json_schema is too deeply nested")


def _where(parts: list) -> str:
    keyword, holder = keyword_at(parts)
    return f"keyword {keyword!r} at {holder}"


def _fail(key: GrammarKey, message: str) -> None:
    raise InvalidRequestError(message, field=key.field)
