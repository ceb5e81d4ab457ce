"""Checking generated text against a constraint, for validate-and-retry and for parsed values.

JSON schemas are checked with ``jsonschema`` when it is installed, with the pydantic model when
the schema came from one, else with a built-in checker covering the common keywords (type,
properties, required, additionalProperties, items, enum, const, anyOf/oneOf, min/max, lengths,
pattern).
"""
from __future__ import annotations

import functools
import json
import re
from typing import Any

_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)
_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None),
          "integer": int, "number": (int, float)}


def extract_json(text: str) -> str:
    """The JSON document in ``text``: chat models like to wrap it in a code fence."""
    match = _FENCE.match(text)
    return (match.group(1) if match else text).strip()


def parse_json(text: str, model: type | None = None) -> tuple[Any, str]:
    """Parse ``text`` (into ``model`` when it is a pydantic model); returns (value, cleaned
    text) or raises ValueError."""
    cleaned = extract_json(text)
    value = json.loads(cleaned)
    if model is not None and hasattr(model, "model_validate"):
        return model.model_validate(value), cleaned
    return value, cleaned


def check_json(text: str, schema: str | dict[str, Any], model: type | None = None) -> tuple[Any, str]:
    """Parse ``text`` and validate it; returns (value, cleaned text) or raises ValueError."""
    if model is not None and hasattr(model, "model_validate"):
        return parse_json(text, model)
    value, cleaned = parse_json(text)
    schema_text = schema if isinstance(schema, str) else json.dumps(schema, sort_keys=True)
    validator = _validator(schema_text)
    if validator is None:
        problems = schema_errors(value, json.loads(schema_text))
        if problems:
            raise ValueError("; ".join(problems)) from None
        return value, cleaned
    import jsonschema  # noqa: PLC0415 - optional; _validator found it

    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is not None:  # the error jsonschema.validate would raise
        raise ValueError(error.message)
    return value, cleaned


@functools.lru_cache(maxsize=256)
def _validator(schema_text: str) -> Any:
    """A jsonschema validator for the schema, built once (None without jsonschema).

    NOTE: ``jsonschema.validate`` checks the schema against its metaschema on every call:
    6.4 ms per output for a 5-field schema on the dev box, 1.6 s of a 256-program
    ``run_batch`` spent after the engine's answers came back; a reused validator takes 0.14 ms.
    """
    try:
        import jsonschema  # noqa: PLC0415 - optional
    except ImportError:
        return None
    schema = json.loads(schema_text)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)  # an invalid schema raises SchemaError, as jsonschema.validate does
    return cls(schema)


def schema_errors(value: Any, schema: dict[str, Any], path: str = "$") -> list[str]:
    """Violations of ``schema`` by ``value`` (empty when it conforms)."""
    if not isinstance(schema, dict) or not schema:
        return []
    errors = _type_errors(value, schema, path)
    if errors:
        return errors
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} not in {schema['enum']!r}")
    if "const" in schema and value != schema["const"]:
        errors.append(f"{path}: {value!r} != {schema['const']!r}")
    for key in ("anyOf", "oneOf"):
        if key in schema and all(schema_errors(value, s, path) for s in schema[key]):
            errors.append(f"{path}: matches none of {key}")
    errors += _bound_errors(value, schema, path)
    if isinstance(value, dict):
        errors += _object_errors(value, schema, path)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            errors += schema_errors(item, schema["items"], f"{path}[{i}]")
    return errors


def _type_errors(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    kinds = schema.get("type")
    if kinds is None:
        return []
    kinds = kinds if isinstance(kinds, list) else [kinds]
    for kind in kinds:
        expected = _TYPES.get(kind, object)
        # NOTE: bool is an int in Python but not an integer in JSON.
        if isinstance(value, expected) and not (isinstance(value, bool) and kind in ("integer", "number")):
            return []
    return [f"{path}: expected {' or '.join(kinds)}, got {type(value).__name__}"]


def _bound_errors(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    errors = []
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{path}: {value} < minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{path}: {value} > maximum {schema['maximum']}")
    sized = value if isinstance(value, (str, list)) else None
    if sized is not None:
        low = schema.get("minLength", schema.get("minItems"))
        high = schema.get("maxLength", schema.get("maxItems"))
        if low is not None and len(sized) < low:
            errors.append(f"{path}: shorter than {low}")
        if high is not None and len(sized) > high:
            errors.append(f"{path}: longer than {high}")
    if isinstance(value, str) and "pattern" in schema and not re.search(schema["pattern"], value):
        errors.append(f"{path}: does not match {schema['pattern']!r}")
    return errors


def _object_errors(value: dict[str, Any], schema: dict[str, Any], path: str) -> list[str]:
    props = schema.get("properties", {})
    errors = [f"{path}: missing {k!r}" for k in schema.get("required", []) if k not in value]
    for key, item in value.items():
        if key in props:
            errors += schema_errors(item, props[key], f"{path}.{key}")
        elif schema.get("additionalProperties") is False:
            errors.append(f"{path}: unexpected property {key!r}")
    return errors
