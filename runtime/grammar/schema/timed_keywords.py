"""The regex keywords of the output check (``pattern``, ``patternProperties``,
``additionalProperties`` beside them) with a time bound on every search.

jsonschema searches with the standard ``re`` module, which backtracks: ``^(a|aa)+$`` takes seconds
on 34 characters that fail it, and the time doubles with each character more. The output check
runs in the server's main process, so a schema whose output is checked against such a pattern
(a ``oneOf`` branch the output did not take, a ``not``) could stall every request. These
keywords search with the ``regex`` package instead, whose matcher stops at ``SEARCH_TIMEOUT_S``
and raises ``PatternTimeout``; ``validator.py`` turns that into a failed check, never a pass.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Iterator

import regex

# A linear search over an output of max_new_tokens takes well under a millisecond.
SEARCH_TIMEOUT_S = 0.05


class PatternTimeout(Exception):
    """A schema pattern's search over part of an output ran past ``SEARCH_TIMEOUT_S``."""

    def __init__(self, pattern: str) -> None:
        super().__init__(f"searching the schema pattern {pattern!r} took longer than "
                         f"{SEARCH_TIMEOUT_S * 1000:.0f} ms (its matching backtracks)")
        self.pattern = pattern


@lru_cache(maxsize=1024)
def _compiled(pattern: str) -> Any:
    return regex.compile(pattern)


def search(pattern: str, text: str, timeout_s: float = SEARCH_TIMEOUT_S) -> bool:
    """``re.search(pattern, text)`` within ``timeout_s`` (``PatternTimeout`` past it; a pattern
    the ``regex`` package cannot read raises its ``regex.error``)."""
    try:
        return _compiled(pattern).search(text, timeout=timeout_s) is not None
    except TimeoutError:
        raise PatternTimeout(pattern) from None


def pattern(validator: Any, patrn: str, instance: Any, schema: dict) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if validator.is_type(instance, "string") and not search(patrn, instance):
        yield ValidationError(f"{instance!r} does not match {patrn!r}")


def pattern_properties(validator: Any, patterns: dict, instance: Any,
                       schema: dict) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for patrn, subschema in patterns.items():
        for k, v in instance.items():
            if search(patrn, k):
                yield from validator.descend(v, subschema, path=k, schema_path=patrn)


def additional_properties(validator: Any, ap: Any, instance: Any,
                          schema: dict) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "object"):
        return
    extras = sorted(_additional(instance, schema), key=str)
    if validator.is_type(ap, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], ap, path=extra)
    elif ap is False and extras:
        names = ", ".join(map(repr, extras))
        yield ValidationError(f"Additional properties are not allowed ({names} unexpected)")


def _additional(instance: dict, schema: dict) -> Iterator[str]:
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    for name in instance:
        if name not in properties and not any(search(p, name) for p in patterns):
            yield name


KEYWORDS = {"pattern": pattern, "patternProperties": pattern_properties,
            "additionalProperties": additional_properties}
