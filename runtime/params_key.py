"""``params_key``: a sampling-params dict as a hashable key, for remembering what was already
validated (a burst's requests mostly share their params: validating each distinct dict once
saves a ``SamplingParams`` build per request, in the server and in the Engine; issue 29)."""
from __future__ import annotations

from typing import Any, Mapping

TEXT_MAX = 4096  # a dict with a longer string (a large schema) gets no key: bounds a memo's memory
LIST_MAX = 64


def params_key(params: Mapping[str, Any]) -> tuple | None:
    """``params`` as a key that tells apart every dict validation could tell apart (type
    included: ``1`` and ``1.0`` and ``True`` validate differently), or None (not kept)."""
    items = []
    for k, v in params.items():
        if isinstance(v, str) and len(v) > TEXT_MAX:
            return None
        if isinstance(v, list):
            if len(v) > LIST_MAX or any(isinstance(x, str) and len(x) > TEXT_MAX for x in v):
                return None
            v = (list, *((type(x), x) for x in v))
        items.append((k, type(v), v))
    key = tuple(sorted(items, key=lambda item: item[0]))
    try:
        hash(key)
    except TypeError:  # a nested dict or the like: no key
        return None
    return key
