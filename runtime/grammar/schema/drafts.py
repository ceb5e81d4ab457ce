"""Older JSON Schema spellings (draft-04 to 2019-09) rewritten to their 2020-12 form, one
schema object at a time; annotations and unknown keys dropped (they say nothing about the
instance: validators ignore them)."""
from __future__ import annotations


# Every keyword JSON Schema (04..2020-12) gives meaning to; any other key is ignored by
# validators, so it is dropped here (a misplaced property name, a vendor extension).
KNOWN = frozenset({
    "type", "enum", "const", "properties", "patternProperties", "additionalProperties",
    "required", "propertyNames", "minProperties", "maxProperties", "items", "prefixItems",
    "additionalItems", "minItems", "maxItems", "uniqueItems", "contains", "minContains",
    "maxContains", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
    "minLength", "maxLength", "pattern", "format", "anyOf", "oneOf", "allOf", "not", "if", "then",
    "else", "dependentRequired", "dependentSchemas", "dependencies", "$ref", "$defs",
    "definitions", "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef"})
# NOTE: "nullable" and "discriminator" are OpenAPI words; JSON Schema validators ignore them, so
# the backstop (which validates against the original) does too: dropping them is exact.


def to_2020_12(node: dict) -> dict:
    """``node`` without annotations, with draft-04..2019-09 keywords in their 2020-12 form."""
    out = {k: v for k, v in node.items() if k in KNOWN}
    for side, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        flag = out.get(side)
        if isinstance(flag, bool):  # draft-04: a flag on minimum/maximum
            del out[side]
            if flag and bound in out:
                out[side] = out.pop(bound)
    if isinstance(out.get("items"), list):  # draft-04..2019-09 tuple form
        out["prefixItems"] = out.pop("items")
        if "additionalItems" in out:
            out["items"] = out.pop("additionalItems")
    else:
        out.pop("additionalItems", None)  # ignored without the tuple form
    deps = out.pop("dependencies", None)
    if isinstance(deps, dict):
        for name, dep in deps.items():
            key = "dependentRequired" if isinstance(dep, list) else "dependentSchemas"
            out.setdefault(key, {})[name] = dep
    return out
