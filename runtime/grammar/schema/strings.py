"""String keywords the backends get wrong on their own: ``format`` is spelled as an exact
``pattern`` (one regex per format, valid under the format's RFC: never wider), and length bounds
beside a ``pattern`` (xgrammar ignores them there) are folded into the pattern or rejected.

Both backends match ``pattern`` against the whole string (a subset of JSON Schema's search
semantics, so sound); the width of that full match is what the bounds are compared with.
"""
from __future__ import annotations

import re
from typing import Any

from .rejection import Impossible, reject

try:  # the parser behind ``re``: gives a pattern's (min, max) width in characters
    import re._parser as _sre_parse  # type: ignore[import-not-found]
except ImportError:  # Python < 3.11
    import sre_parse as _sre_parse  # type: ignore[no-redef]

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
_MAXREPEAT = _sre_parse.MAXREPEAT
# One character (class) followed by one quantifier, optionally anchored: ^[a-z]+$, \d{2,}, .*
_SIMPLE = re.compile(r"^\^?(\[(?:\\.|[^\]\\])+\]|\\.|[^\\^$|()?*+{}\[\]])"
                     r"(\*|\+|\?|\{\d+\}|\{\d+,\d*\})?\$?$")


def normalize_string(node: dict, path: str) -> dict:
    """``node`` with its format as a pattern and its length bounds reconciled with it."""
    fmt = node.get("format")
    if fmt in FORMAT_PATTERNS:
        if "pattern" in node and node["pattern"] != FORMAT_PATTERNS[fmt]:
            raise reject("format", path, f"format {fmt!r} together with a pattern")
        node = {**node, "pattern": FORMAT_PATTERNS[fmt]}
        del node["format"]
    if "pattern" in node and ("minLength" in node or "maxLength" in node):
        node = _fold_lengths(node, path)
    return node


def pattern_width(pattern: str) -> tuple[int, int | None]:
    """(min, max) characters of a full match of ``pattern`` (max None: unbounded)."""
    lo, hi = _sre_parse.parse(pattern).getwidth()
    return lo, (None if hi >= _MAXREPEAT else hi)


def _fold_lengths(node: dict, path: str) -> dict:
    pattern = node["pattern"]
    lo_len, hi_len = node.get("minLength", 0), node.get("maxLength")
    try:
        lo, hi = pattern_width(pattern)
    except (re.error, OverflowError, RecursionError, TypeError) as e:
        raise reject("pattern", path, f"the pattern does not parse: {e}") from None
    out = {k: v for k, v in node.items() if k not in ("minLength", "maxLength")}
    if lo >= lo_len and hi is not None and (hi_len is None or hi <= hi_len):
        return out  # every full match already has an allowed length
    simple = _SIMPLE.match(pattern)
    if simple is None:
        raise reject("maxLength" if hi_len is not None else "minLength", path,
                     "length bounds beside a pattern are enforced only when the pattern's own "
                     "length fits them or the pattern is one character class repeated "
                     "(like ^[a-z0-9_]+$)")
    atom, quant = simple.group(1), simple.group(2) or "{1}"
    q_lo, q_hi = _quantifier(quant)
    new_lo = max(q_lo, lo_len)
    new_hi = q_hi if hi_len is None else (hi_len if q_hi is None else min(q_hi, hi_len))
    if new_hi is not None and new_lo > new_hi:
        raise Impossible(path, "the pattern's lengths and minLength/maxLength do not meet")
    out["pattern"] = f"^{atom}{{{new_lo},{'' if new_hi is None else new_hi}}}$"
    return out


def _quantifier(q: str) -> tuple[int, int | None]:
    if q in ("*", "+", "?"):
        return {"*": (0, None), "+": (1, None), "?": (0, 1)}[q]
    body = q[1:-1]
    if "," not in body:
        return int(body), int(body)
    lo, hi = body.split(",")
    return int(lo), (int(hi) if hi else None)



