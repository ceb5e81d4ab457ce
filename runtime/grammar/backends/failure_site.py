"""Where a JSON schema the normalizer accepted failed in the backend's compiler, so the request
error names the keyword and its path as every other rejection does.

The backends report only their own view (xgrammar: "Regex parsing error at position 5:
Backreference is not supported yet"; outlines-core: "Failed to build DFA error building
NFA"). Almost every such failure is one regular expression the backend cannot read, so on a
failure each ``pattern`` (and ``patternProperties`` name) of the original schema is compiled
alone, as the string schema it belongs to, and the first that fails is named. Runs in the
compile worker, only after a failure, bounded by ``MAX_TRIED`` compiles.
"""
from __future__ import annotations

import json
import re
from typing import Any, Callable, Iterator

from ...errors import InvalidRequestError
from ..base import GrammarKey
from ..schema.support import LISTS, NAMED, SINGLE

MAX_TRIED = 64
# xgrammar prefixes its messages with the time and its source line ("[20:14:30] /project/...")
_NATIVE_PREFIX = re.compile(r"^\[\d\d:\d\d:\d\d\] \S+:\d+: ")


def failure_site(schema: Any, compiles: Callable[[dict], object]) -> tuple[str, str] | None:
    """(keyword, path) of the first pattern of ``schema`` that ``compiles`` (a backend's
    compile of one schema) raises on alone; None when none does."""
    for tried, (keyword, path, alone) in enumerate(_patterns(schema, "#")):
        if tried >= MAX_TRIED:
            return None
        try:
            compiles(alone)
        except Exception:  # noqa: BLE001 - any failure names the site
            return keyword, path
    return None


def site_message(backend: str, site: tuple[str, str] | None, error: BaseException) -> str:
    """The request error for a backend failure at ``site`` (None: not found)."""
    keyword, path = site or ("(schema)", "#")
    why = _NATIVE_PREFIX.sub("", _last_line(error))
    return f"json_schema keyword {keyword!r} at {path} cannot be compiled by {backend}: {why}"


def compile_error(backend: str, key: GrammarKey, error: BaseException,
                  builds: Callable[[GrammarKey], object], detail: str) -> InvalidRequestError:
    """The request error for ``key``, which ``backend`` failed to compile with ``error``: for a
    JSON schema the keyword and path that fail (``builds``: the backend's compile of a key),
    else ``detail`` (the backend's own message, shortened)."""
    if key.kind == "json_schema":
        site = failure_site(json.loads(key.text),
                            lambda sub: builds(GrammarKey("json_schema", json.dumps(sub))))
        return InvalidRequestError(site_message(backend, site, error), field=key.field)
    return InvalidRequestError(f"{backend} cannot compile this {key.field}: {detail}",
                               field=key.field)


def _patterns(node: Any, path: str) -> Iterator[tuple[str, str, dict]]:
    """(keyword, path, the schema that compiles it alone) for each pattern under ``node``."""
    if not isinstance(node, dict):
        return
    if isinstance(node.get("pattern"), str):
        yield "pattern", path, {"type": "string", "pattern": node["pattern"]}
    for name in node.get("patternProperties") or {}:
        if isinstance(name, str):
            yield "patternProperties", path, {"type": "object", "patternProperties": {name: {}}}
    for key, value in node.items():
        if key in NAMED and isinstance(value, dict):
            for name, sub in value.items():
                yield from _patterns(sub, f"{path}/{key}/{_escape(name)}")
        elif key in LISTS and isinstance(value, list):
            for i, sub in enumerate(value):
                yield from _patterns(sub, f"{path}/{key}/{i}")
        elif key in SINGLE or key == "items" and isinstance(value, list):
            subs = value if isinstance(value, list) else [value]
            for i, sub in enumerate(subs):
                suffix = f"/{i}" if isinstance(value, list) else ""
                yield from _patterns(sub, f"{path}/{key}{suffix}")


def _escape(name: str) -> str:
    return str(name).replace("~", "~0").replace("/", "~1")


def _last_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return (text.splitlines()[-1] if "\n" in text else text)[:500]
