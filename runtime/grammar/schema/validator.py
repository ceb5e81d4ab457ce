"""The backstop: a finished constrained output checked against the request's *original* schema.

Grammars enforce the normalized schema, which implies the original; this check catches what no
grammar can promise (``oneOf`` branches that overlap, a backend bug) so that such an output is
reported as an error, never as a success. Validators are built once per schema text (bounded
LRU) with the draft the schema declares; formats are asserted for the ones the normalizer spells
as exact patterns (others stay annotations, as JSON Schema says). Schema patterns are searched
with a time bound (``timed_keywords.py``): a pattern that backtracks fails the check, with the
reason, instead of stalling the process that runs it."""
from __future__ import annotations

import copy
import json
from collections import OrderedDict
from typing import Any

from .strings import ENFORCED_FORMATS
from .timed_keywords import KEYWORDS, PatternTimeout


class OutputValidator:
    def __init__(self, cache_size: int = 256) -> None:
        self.cache_size = cache_size
        self._cache: OrderedDict[str, Any] = OrderedDict()

    def violation(self, schema_text: str, output: str) -> str | None:
        """None if ``output`` is JSON valid under the schema, else why not (one line)."""
        try:
            value = json.loads(output)
        except ValueError as e:
            return f"the output is not valid JSON: {e}"
        validator = self._validator(schema_text)
        if validator is None:
            return None  # an ANY_JSON / json_object request: parsing is the whole check
        try:
            error = next(iter(validator.iter_errors(value)), None)
        except PatternTimeout as e:
            return f"the output could not be checked against the json_schema: {e}"
        if error is None:
            return None
        where = "/".join(str(p) for p in error.absolute_path)
        keyword_at = "/".join(str(p) for p in error.absolute_schema_path)
        return (f"the output violates the json_schema at instance path /{where} "
                f"(schema #/{keyword_at}): {error.message[:300]}")

    def _validator(self, schema_text: str) -> Any:
        hit = self._cache.get(schema_text)
        if hit is not None or schema_text in self._cache:
            self._cache.move_to_end(schema_text)
            return hit
        import jsonschema

        validator = None
        if schema_text:
            schema = json.loads(schema_text)
            cls = jsonschema.validators.extend(validator_class(schema), KEYWORDS)
            checker = copy.copy(cls.FORMAT_CHECKER)
            checker.checkers = {k: v for k, v in cls.FORMAT_CHECKER.checkers.items()
                                if k in ENFORCED_FORMATS}
            validator = cls(schema, format_checker=checker)
        self._cache[schema_text] = validator
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return validator


def validator_class(schema: Any) -> Any:
    """The jsonschema validator class for ``schema``: the draft its ``$schema`` names, else the
    newest draft whose meta-schema it satisfies (so an undeclared draft-04 schema, with its
    boolean ``exclusiveMinimum`` or tuple ``items``, is read as draft-04)."""
    import jsonschema

    from .lenient import without_repeats

    declared = isinstance(schema, dict) and "$schema" in schema
    cls = jsonschema.validators.validator_for(schema, jsonschema.Draft202012Validator)
    if declared:
        return cls
    probe = without_repeats(schema)  # a repeated enum value does not make it another draft
    for candidate in (jsonschema.Draft202012Validator, jsonschema.Draft7Validator,
                      jsonschema.Draft4Validator):
        if candidate(candidate.META_SCHEMA).is_valid(probe):
            return candidate
    return cls
