"""String keywords the backends get wrong on their own: ``format`` is spelled as an exact
``pattern`` (one regex per format, valid under the format's RFC: never wider), length bounds
beside a ``pattern`` (xgrammar ignores them there) are folded into the pattern exactly
(``pattern_length.py``) or left to the runtime (``lengths.py``), and lookaround assertions (xgrammar ignores them too) are
spelled without them where ``lookaround.py`` knows the idiom, else rejected.

Both backends match ``pattern`` against the whole string (a subset of JSON Schema's search
semantics, so sound); the width of that full match is what the bounds are compared with.
"""
from __future__ import annotations

import re
from typing import Any

from .lengths import GRAMMAR_MAX, UNFOLDED
from .lookaround import without_lookaround
from .pattern_length import fold_lengths, largest_count
from .pattern_meet import meet_pattern_keywords
from .patterns import Unfoldable
from .rejection import Impossible, reject

try:  # the parser behind ``re``: finds assertions in a pattern
    import re._parser as _sre_parse  # type: ignore[import-not-found]
except ImportError:  # Python < 3.11
    import sre_parse as _sre_parse  # type: ignore[no-redef]
_ASSERT, _ASSERT_NOT = _sre_parse.ASSERT, _sre_parse.ASSERT_NOT

_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_H16 = r"[0-9a-fA-F]{1,4}"
# NOTE: years 0001-9999 (format checkers reject year 0000, the shortest completion's choice).
_DATE = (r"([1-9][0-9]{3}|0([1-9][0-9]{2}|0([1-9][0-9]|0[1-9])))-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)"
         r"|02-(0[1-9]|1[0-9]|2[0-8]))")  # NOTE: no 02-29 (leap years need arithmetic)
# NOTE: "{0,1}", not "?": xgrammar 0.2.8 compiles "(\.[0-9]{1,6})?" inside a JSON-schema
# pattern so that it also accepts "0000" without the dot (a forced completion found it).
_TIME = (r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6}){0,1}"
         r"(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])")
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?"
_URI_CHAR = r"([A-Za-z0-9._~!$&'()*+,;=:@/?-]|%[0-9A-Fa-f]{2})"
FORMAT_PATTERNS: dict[str, str] = {
    "date": f"^{_DATE}$",
    "time": f"^{_TIME}$",
    "date-time": f"^{_DATE}T{_TIME}$",
    "email": rf"^[A-Za-z0-9_+-]+(\.[A-Za-z0-9_+-]+)*@{_LABEL}(\.{_LABEL})+$",  # NOTE: no label
    # length bound: {0,61} made this one pattern take 1 s to compile
    "uri": rf"^[A-Za-z][A-Za-z0-9+.-]*:{_URI_CHAR}+$",
    "uuid": r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
    "ipv4": rf"^{_OCTET}(\.{_OCTET}){{3}}$",
    "ipv6": rf"^({_H16}:){{7}}{_H16}$",  # NOTE: the full form only ("::" shortenings are valid
    # but optional for a generator; every full-form address is valid)
}
ENFORCED_FORMATS = tuple(FORMAT_PATTERNS)


def normalize_string(node: dict, path: str) -> dict:
    """``node`` with its format as a pattern and its length bounds reconciled with it."""
    fmt = node.get("format")
    if fmt in FORMAT_PATTERNS:
        pattern = FORMAT_PATTERNS[fmt]
        if "pattern" in node and node["pattern"] != pattern:
            pattern = meet_pattern_keywords(node["pattern"], pattern, path)
        node = {**node, "pattern": pattern}
        del node["format"]
    if "pattern" in node:
        node = {**node, "pattern": spell_assertions(node["pattern"], path)}
    if "pattern" in node and ("minLength" in node or "maxLength" in node):
        node = _fold_lengths(node, path)
    return node


def _fold_lengths(node: dict, path: str) -> dict:
    lo_len, hi_len = node.get("minLength", 0), node.get("maxLength")
    out = {k: v for k, v in node.items() if k not in ("minLength", "maxLength")}
    try:
        folded = fold_lengths(node["pattern"], lo_len, hi_len)
    except Unfoldable:
        # NOTE: counted at runtime instead where the position allows (lengths.py), else
        # rejected there; the bounds stay beside the pattern until then
        return {**node, UNFOLDED: True}
    if folded is None:
        raise Impossible(path, "the pattern's lengths and minLength/maxLength do not meet",
                         "pattern")
    if largest_count(folded) > largest_count(node["pattern"]):
        # NOTE: a fold that adds counts (a URL pattern's ``.+`` under maxLength 2000 became
        # ``.{1,1993}``, seven of them in one schema: past the compile deadline) is lengths.py's
        # to choose: kept, or the bounds counted at runtime where it is large or the schema's
        # counts are over budget; the bounds stay beside the pattern until then
        return {**node, UNFOLDED: folded}
    out["pattern"] = folded
    return out


def spell_assertions(pattern: Any, path: str) -> Any:
    """``pattern``, its lookarounds spelled out where ``lookaround.py`` knows the idiom; other
    lookarounds are refused: xgrammar ignores them (``^(?!clyde).*$`` let "clyde" through)."""
    try:
        tree = _sre_parse.parse(pattern)
    except (re.error, OverflowError, RecursionError, TypeError) as e:
        raise reject("pattern", path, f"the pattern does not parse: {e}") from None
    if not _has_lookaround(tree):
        return pattern
    try:
        return without_lookaround(pattern)
    except Unfoldable as e:
        raise reject("pattern", path, f"lookahead/lookbehind assertions are not enforced "
                                      f"({e})") from None


def _has_lookaround(x: Any) -> bool:
    """Whether a parsed pattern (a SubPattern, an (opcode, argument) pair, or an argument's
    tuples and lists) holds an assertion; opcodes are singletons, hence ``is``."""
    if isinstance(x, tuple) and len(x) == 2 and (x[0] is _ASSERT or x[0] is _ASSERT_NOT):
        return True
    if isinstance(x, (_sre_parse.SubPattern, list, tuple)):
        return any(_has_lookaround(y) for y in x)
    return False
