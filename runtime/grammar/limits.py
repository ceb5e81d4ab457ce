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

from ..errors import InvalidRequestError
from .base import GrammarKey

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
    # 4 s); outlines-core's limit is lower and checked in schema_support.
    max_schema_bound: int = 100_000  # minItems/maxLength... in a json_schema
    max_choices: int = 4096

    def check(self, key: GrammarKey) -> None:
        """Raise ``InvalidRequestError(field=key.field)`` naming the broken limit."""
        size = len(key.text.encode("utf-8", "surrogatepass"))
        if size > self.max_text_bytes:
            _fail(key, f"{key.field} is {size} bytes; the limit is {self.max_text_bytes}")
        if key.kind == "json_schema":
            self._check_schema(key)
        elif key.kind in ("regex", "ebnf"):
            self._check_repetition(key, key.text)
        elif key.kind == "choices" and len(json.loads(key.text)) > self.max_choices:
            _fail(key, f"at most {self.max_choices} choices are allowed")

    def _check_repetition(self, key: GrammarKey, text: str) -> None:
        for m in _REPEAT.finditer(text):
            for bound in m.groups():
                if bound and int(bound) > self.max_repetition:
                    _fail(key, f"repetition bound {{{m.group(0)[1:-1]}}} exceeds the limit "
                               f"of {self.max_repetition}")

    def _check_schema(self, key: GrammarKey) -> None:
        try:
            schema = json.loads(key.text)
        except (ValueError, RecursionError) as e:
            _fail(key, f"json_schema is not valid JSON: {e}")
        if not isinstance(schema, (dict, bool)):
            _fail(key, "json_schema must be a JSON object (or a boolean)")
        self._walk(key, schema, 1)
        _check_meta_schema(key, schema)

    def _walk(self, key: GrammarKey, node: Any, depth: int) -> None:
        if depth > self.max_json_depth:
            _fail(key, f"json_schema nesting depth exceeds the limit of {self.max_json_depth}")
        if isinstance(node, dict):
            for k, v in node.items():
                if k in _BOUND_KEYS and isinstance(v, (int, float)) and v > self.max_schema_bound:
                    _fail(key, f"json_schema {k}={v} exceeds the limit of {self.max_schema_bound}")
                if k == "pattern" and isinstance(v, str):
                    self._check_repetition(key, v)
                self._walk(key, v, depth + 1)
        elif isinstance(node, list):
            for v in node:
                self._walk(key, v, depth + 1)


def _check_meta_schema(key: GrammarKey, schema: Any) -> None:
    """Reject schemas that break the JSON Schema meta-schema (e.g. ``"type": 5``)."""
    try:
        import jsonschema
    except ImportError:  # optional: the backends still reject what they cannot parse
        return
    from .schema.validator import validator_class

    try:
        validator_class(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "(root)"
        _fail(key, f"json_schema is not a valid JSON Schema at {where}: {e.message}")
    except RecursionError:
        _fail(key, "json_schema is too deeply nested")


def _fail(key: GrammarKey, message: str) -> None:
    raise InvalidRequestError(message, field=key.field)
