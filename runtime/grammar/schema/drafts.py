"""Older JSON Schema spellings (draft-04 to 2019-09) rewritten to their 2020-12 form, one
schema object at a time, and the annotations dropped (they say nothing about the instance)."""
from __future__ import annotations

from typing import Any

ANNOTATIONS = frozenset({
    "title", "description", "$comment", "default", "examples", "$schema", "$id", "id",
    "$anchor", "$dynamicAnchor", "$vocabulary", "deprecated", "readOnly", "writeOnly",
    "contentMediaType", "contentEncoding", "contentSchema", "example", "nullable",
    "discriminator", "xml", "externalDocs", "markdownDescription", "deprecationMessage",
    "enumDescriptions", "markdownEnumDescriptions", "errorMessage", "$recursiveAnchor"})
# NOTE: "nullable" and "discriminator" are OpenAPI words; JSON Schema validators ignore them, so
# the backstop (which validates against the original) does too: dropping them is exact.


def to_2020_12(node: dict) -> dict:
    """``node`` without annotations, with draft-04..2019-09 keywords in their 2020-12 form."""
    out = {k: v for k, v in node.items() if k not in ANNOTATIONS and not k.startswith("x-")}
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
