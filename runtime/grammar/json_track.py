"""Where a JSON output stands, byte by byte: the open containers, the keys each open object has,
and, for arrays the normalized schema marks as unique strings (``schema/arrays.UNIQUE_MARK``),
the items written so far. ``unique_keys.py`` masks with it what a grammar cannot forbid.

A state is immutable (one per accepted token, for rollback). To know which arrays are marked,
each container keeps its *candidates*: the normalized schema nodes it may be an instance of
(``anyOf``/``oneOf``/``allOf`` branches and ``$ref`` targets all count; a mark on any of them
applies, which can only forbid more). Without a schema only keys are tracked.
"""
from __future__ import annotations

import functools
import json
from typing import Any, NamedTuple

import regex

from .schema.arrays import UNIQUE_MARK
from .schema.timed_keywords import PatternTimeout, search

_QUOTE, _BACKSLASH = 0x22, 0x5C
_OBJ, _ARR = "o", "a"
_MAX_EXPAND = 64  # schema nodes one position may stand for
_KEY_SEARCH_S = 0.005


class Frame(NamedTuple):
    """An open object (``names``: its keys; ``expect_key``; ``last``: the newest key) or array
    (``names``: its items when ``unique``; ``index``: the current item)."""

    kind: str
    names: frozenset = frozenset()
    expect_key: bool = True
    last: str | None = None
    index: int = 0
    unique: bool = False
    cands: tuple = ()


class JsonTrack(NamedTuple):
    frames: tuple = ()
    string: bool = False
    buf: bytes | None = None  # raw bytes of an open key, or of an item of a unique array
    escape: bool = False
    root: Any = None  # the normalized schema, when it marks unique arrays

    def advance(self, data: bytes) -> "JsonTrack":
        frames, string, buf, escape = list(self.frames), self.string, self.buf, self.escape
        for b in data:
            if string:
                if escape:
                    escape = False
                elif b == _BACKSLASH:
                    escape = True
                elif b == _QUOTE:
                    string = False
                    if buf is not None:
                        frames[-1] = _closed(frames[-1], _decode(buf))
                        buf = None
                    continue
                if buf is not None:
                    buf += bytes((b,))
            elif b == _QUOTE:
                string = True
                top = frames[-1] if frames else None
                if top is not None and (top.expect_key if top.kind == _OBJ else top.unique):
                    buf = b""
            elif b in (0x7B, 0x5B):  # { [
                cands = self._position(frames)
                frames.append(Frame(_OBJ, cands=cands) if b == 0x7B else Frame(
                    _ARR, unique=any(c.get(UNIQUE_MARK) for c in cands), cands=cands))
            elif b in (0x7D, 0x5D) and frames:  # } ]
                frames.pop()
            elif b == 0x2C and frames:  # ,
                top = frames[-1]
                frames[-1] = top._replace(expect_key=True) if top.kind == _OBJ else \
                    top._replace(index=top.index + 1)
        return JsonTrack(tuple(frames), string, buf, escape, self.root)

    def _position(self, frames: list) -> tuple:
        """Schema candidates of the value that starts now."""
        if self.root is None:
            return ()
        if not frames:
            return _expand(self.root, [self.root])
        top = frames[-1]
        if top.kind == _OBJ:
            return _expand(self.root, _members(top.cands, top.last))
        return _expand(self.root, _items(top.cands, top.index))

    def closes_duplicate(self, data: bytes) -> bool:
        """True if ``data`` ends the open key (or unique item) with one its container has."""
        if self.buf is None or not self.frames[-1].names:
            return False
        buf, escape = self.buf, self.escape
        for i, b in enumerate(data):
            if escape:
                escape = False
            elif b == _BACKSLASH:
                escape = True
            elif b == _QUOTE:
                return _decode(buf + data[:i]) in self.frames[-1].names
        return False

    def summary(self, names: bool = True) -> tuple:
        """The state as far as the future goes (hashable): an open string that is no prefix
        of a name its container has cannot collide, so all such strings are one state.
        ``names=False`` leaves out the names each container has (the open string still
        counts as colliding or not)."""
        buf = self.buf
        if buf is not None and not any(isinstance(k, str) and k.startswith(_prefix(buf))
                                       for k in self.frames[-1].names):
            buf = b"*"
        frames = tuple((f.kind, f.names if names else None, f.expect_key, f.unique,
                        tuple(map(id, f.cands))) for f in self.frames)
        return frames, self.string, buf, self.escape


def _closed(frame: Frame, name: Any) -> Frame:
    if frame.kind == _OBJ:
        return frame._replace(names=frame.names | {name}, expect_key=False, last=name)
    return frame._replace(names=frame.names | {name})


def _decode(raw: bytes) -> Any:
    """A string as JSON means it (escapes resolved); the raw bytes if it does not decode."""
    try:
        return json.loads(b'"' + raw + b'"')
    except ValueError:
        return raw


def _prefix(raw: bytes) -> str:
    return raw.decode("utf-8", "ignore").replace("\\", "")


def _members(cands: tuple, key: str | None) -> list:
    out = []
    for c in cands:
        props = c.get("properties") or {}
        if key in props:
            out.append(props[key])
            continue
        matched = [s for p, s in (c.get("patternProperties") or {}).items()
                   if isinstance(key, str) and _search(p, key)]
        extra = c.get("additionalProperties")
        out += matched or ([extra] if isinstance(extra, dict) else [])
    return out


def _items(cands: tuple, index: int) -> list:
    out = []
    for c in cands:
        prefix = c.get("prefixItems") or []
        item = prefix[index] if index < len(prefix) else c.get("items")
        if isinstance(item, dict):
            out.append(item)
    return out


@functools.lru_cache(maxsize=4096)
def _search(pattern: str, key: str) -> bool:
    # NOTE: runs on the scheduler thread as keys close: time-bounded (a backtracking pattern
    # would stall every request) and cached (the same keys recur across requests)
    try:
        return search(pattern, key, _KEY_SEARCH_S)
    except (PatternTimeout, regex.error):
        return True  # unreadable or too slow: assume it may apply (forbids more)


def _expand(root: dict, nodes: list) -> tuple:
    """``nodes`` with their ``$ref`` targets and combinator branches, each once."""
    out: dict[int, dict] = {}
    todo = list(nodes)
    while todo and len(out) < _MAX_EXPAND:
        node = todo.pop()
        if not isinstance(node, dict) or id(node) in out:
            continue
        out[id(node)] = node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/"):
            target: Any = root
            for part in ref[2:].split("/"):
                target = target.get(part) if isinstance(target, dict) else None
            todo.append(target)
        for key in ("anyOf", "oneOf", "allOf"):
            todo += [b for b in node.get(key) or () if isinstance(b, dict)]
    return tuple(out.values())
