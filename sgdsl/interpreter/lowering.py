"""Constraint lowering: for each constrained ``gen``, the strongest mechanism the backend has.

1. the backend enforces the constraint natively (``capabilities.constraints``: a runtime grammar,
   OpenAI ``response_format``, an Anthropic forced tool...), possibly after rewriting it
   (``dtype`` -> ``regex``, ``choices`` -> ``regex``);
2. otherwise validate-and-retry: generate, check (regex full match, schema validation, type
   parse, membership) and retry up to ``MAX_ATTEMPTS`` times;
3. an EBNF grammar cannot be checked here, so a backend without it fails with
   ``UnsupportedError`` before the first token.
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any, Callable

from sgdsl.backends.base import Backend
from sgdsl.errors import UnsupportedError
from sgdsl.interpreter.validate import check_json, parse_json
from sgdsl.ir import Constraint

MAX_ATTEMPTS = 3
# NOTE: int, float and str are JSON's own spellings (no "+5", "007", ".5", raw control
# characters or lone backslashes), so a program that splices them into JSON text, as SGLang's
# ``decode_json`` does, gets parseable JSON; int and the float's integer part have at most 19
# digits, the fraction and exponent at most 16 and 3 (docs/structured_output.md).
DTYPE_REGEX = {
    int: r"-?(?:0|[1-9][0-9]{0,18})",
    float: r"-?(?:0|[1-9][0-9]{0,18})(?:\.[0-9]{1,16})?(?:[eE][-+]?[0-9]{1,3})?",
    bool: r"(?:True|False|true|false)",
    str: r'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"',
}


@dataclass(frozen=True)
class Checked:
    ok: bool
    text: str
    parsed: Any = None
    reason: str = ""


@dataclass(frozen=True)
class Plan:
    """``native`` goes to the backend; ``check`` parses (and validates) the output; ``retry``
    says whether a failed check means "generate again" (else the output is kept as is)."""

    native: Constraint | None
    check: Callable[[str], Checked]
    retry: bool
    kind: str | None = None
    parse: Callable[[str], Checked] | None = None  # ``check`` without validation (below)

    def check_result(self, text: str, schema_checked: bool = False) -> Checked:
        """``check(text)``; only ``parse`` when the backend already validated the text against
        the json_schema (``GenResult.schema_checked``)."""
        if schema_checked and self.parse is not None:
            return self.parse(text)
        return self.check(text)


def _plain(text: str) -> Checked:
    return Checked(True, text, text)


_UNCONSTRAINED = Plan(None, _plain, False)


def plan_constraint(backend: Backend, constraint: Constraint | None) -> Plan:
    if constraint is None:
        return _UNCONSTRAINED
    native = backend.capabilities.constraints
    kind = constraint.kind
    if kind == "tools":
        if kind not in native:
            raise UnsupportedError(f"{type(backend).__name__} cannot call tools")
        return Plan(constraint, _plain, False, kind)
    check = _checker(constraint)
    if kind in native:
        parse = (functools.partial(_parse_schema, model=constraint.model)
                 if kind == "json_schema" else None)
        return Plan(constraint, check, False, kind, parse)
    if kind in ("dtype", "choices") and "regex" in native:
        return Plan(Constraint("regex", to_regex(constraint)), check, False, kind)
    if kind == "ebnf":
        raise UnsupportedError(
            f"{type(backend).__name__} cannot enforce an EBNF grammar, and sgdsl cannot validate "
            "EBNF output to retry; use regex or json_schema, or a runtime backend (Local, RuntimeEndpoint)")
    return Plan(None, check, True, kind)


def to_regex(constraint: Constraint) -> str:
    if constraint.kind == "dtype":
        return DTYPE_REGEX[constraint.value]
    if constraint.kind == "choices":
        return "(?:" + "|".join(re.escape(c) for c in constraint.value) + ")"
    return constraint.value


def _checker(constraint: Constraint) -> Callable[[str], Checked]:
    kind, value = constraint.kind, constraint.value
    if kind == "regex":
        return lambda text: _check_regex(text, value)
    if kind == "dtype":
        return lambda text: _check_dtype(text, value)
    if kind == "choices":
        return lambda text: _check_choice(text, tuple(value))
    if kind == "json_schema":
        return lambda text: _check_schema(text, value, constraint.model)
    return _plain  # ebnf: only ever enforced natively


def _check_regex(text: str, pattern: str) -> Checked:
    for candidate in (text, text.strip()):
        if re.fullmatch(pattern, candidate, flags=re.DOTALL):
            return Checked(True, candidate, candidate)
    return Checked(False, text, reason=f"does not fully match /{pattern}/")


def _check_dtype(text: str, dtype: type) -> Checked:
    stripped = text.strip()
    if not re.fullmatch(DTYPE_REGEX[dtype], stripped):
        return Checked(False, text, reason=f"is not a {dtype.__name__}")
    if dtype is bool:
        return Checked(True, stripped, stripped.lower() == "true")
    if dtype is str:
        return Checked(True, stripped, json.loads(stripped))
    return Checked(True, stripped, dtype(stripped))


def _check_choice(text: str, choices: tuple[str, ...]) -> Checked:
    if text in choices:
        return Checked(True, text, text)
    if text.strip() in choices:
        return Checked(True, text.strip(), text.strip())
    return Checked(False, text, reason=f"is not one of {list(choices)!r}")


def _parse_schema(text: str, model: type | None) -> Checked:
    """A json_schema output the backend validated: parsed (into the pydantic model, if any)."""
    try:
        parsed, cleaned = parse_json(text, model)
    except ValueError as exc:
        return Checked(False, text, reason=f"is not valid against the JSON schema: {exc}")
    return Checked(True, cleaned, parsed)


def _check_schema(text: str, schema: Any, model: type | None) -> Checked:
    try:
        parsed, cleaned = check_json(text, schema, model)
    except ValueError as exc:  # json.JSONDecodeError and pydantic's ValidationError are ValueErrors
        return Checked(False, text, reason=f"is not valid against the JSON schema: {exc}")
    return Checked(True, cleaned, parsed)
