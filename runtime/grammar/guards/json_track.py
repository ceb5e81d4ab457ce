"""Where a JSON output stands, byte by byte: the open containers, the keys each open object has,
for arrays the normalized schema marks unique (``schema/arrays.UNIQUE_MARK``) the items
written so far (``unique_items.py`` says when an item ends and how items compare) and the
text of the current one, and for a string whose length bounds the runtime enforces
(``schema/lengths.LENGTH_MARK``) its characters so far (``string_chars.py`` counts them).
``unique_keys.py`` masks with it what a grammar cannot forbid.

A state is immutable (one per accepted token, for rollback). To know which arrays are marked,
each container keeps its *candidates*: the normalized schema nodes it may be an instance of
(``anyOf``/``oneOf``/``allOf`` branches and ``$ref`` targets all count; a unique mark on any of
them applies, which can only forbid more; a string takes the loosest length bound of those that
admit strings, see ``schema/lengths.py``). Without a schema only keys are tracked.
"""
from __future__ import annotations

import functools
import json
from typing import Any, NamedTuple

import regex

from ..schema.arrays import UNIQUE_MARK
from ..schema.timed_keywords import PatternTimeout, search
from ..schema.lengths import string_bound
from .string_chars import NORMAL, scan
from .item_domain import domain_of
from .unique_items import item_value

_FAR = 64  # room (characters) past which a bounded string's summary no longer tells it
_OBJ, _ARR = "o", "a"
_QUOTE, _COMMA, _BRACE = 0x22, 0x2C, 0x7B
_OPEN, _CLOSE = frozenset(b"{["), frozenset(b"}]")
_MAX_EXPAND = 64  # schema nodes one position may stand for
_KEY_SEARCH_S = 0.005
_SCALAR_START = frozenset(b"-0123456789tfn")
# what ends a number or literal item: JSON allows nothing else after one
_SCALAR_END = frozenset(b" \t\r\n,]")


class Frame(NamedTuple):
    """An open object (``names``: its keys; ``expect_key``; ``last``: the newest key) or array
    (``names``: its items when ``unique``, as ``unique_items.item_value`` reads them;
    ``index``: the current item)."""

    kind: str
    names: frozenset = frozenset()
    expect_key: bool = True
    last: str | None = None
    index: int = 0
    unique: bool = False
    cands: tuple = ()
    item: bytes | None = None  # a unique array's current item, its text so far
    scalar: bool = False  # that item is a number, true, false or null still open
    done: bool = False  # that item is finished (its value is in names)
    domain: Any = None  # a unique array's item values, when finite (item_domain.py)


class JsonTrack(NamedTuple):
    frames: tuple = ()
    string: bool = False
    buf: bytes | None = None  # raw bytes of an open key, or of an item of a unique array
    lex: int = NORMAL  # lexical state inside a string (string_chars.scan)
    root: Any = None  # the normalized schema, when it marks unique arrays or lengths
    count: int = 0  # characters of the open string, when it has a runtime ``bound``
    bound: tuple | None = None  # (minLength, maxLength or None, pattern or None) it enforces
    raw: bytes | None = None  # raw bytes of the open string when its bound has a pattern

    def advance(self, data: bytes) -> "JsonTrack":
        return self._run(data)[0]

    def breaks_bound(self, data: bytes) -> bool:
        """True if ``data`` writes past a string's maxLength or closes one short of its
        minLength (only the bounds the runtime enforces: ``schema/lengths.py``)."""
        return self._run(data, strict=True)[1]

    def room_need(self) -> tuple[int | None, int]:
        """(characters the open string may still take, None: any; characters it still
        needs before it may close)."""
        lo, hi, _ = self.bound or (0, None, None)
        return (None if hi is None else hi - self.count), lo - self.count

    def _run(self, data: bytes, strict: bool = False) -> tuple["JsonTrack", bool, bool]:
        """The state after ``data``, whether it broke a length bound (``strict``: the walk
        stops at the first break) and whether it ended a key or unique item its container
        already has."""
        # NOTE: hot (every candidate token of a guarded row): one loop over locals; the steps
        # it calls run on structure only (a string's end, a container, a comma, an item's end)
        frames, string, buf, lex = list(self.frames), self.string, self.buf, self.lex
        count, bound, raw, broke, dup = self.count, self.bound, self.raw, False, False
        starts = [0] * len(frames)  # where each frame's current item text resumes in data
        i, n = 0, len(data)
        while i < n:
            if string:  # up to the closing quote, or the end of data
                chars, end, lex = scan(data, lex, i)
                count += chars
                stop = n if end < 0 else end
                buf = None if buf is None else buf + data[i:stop]
                raw = None if raw is None else raw + data[i:stop]
                if bound is not None and _breaks(bound, count, end >= 0):
                    broke = True
                    if strict:
                        break
                if end < 0:
                    break
                string, count, bound, raw, i = False, 0, None, None, end + 1
                if buf is not None:  # a key, or a string item of a unique array
                    dup |= _end_name(frames, _decode(buf))
                    buf = None
                continue
            b = data[i]
            top = frames[-1] if frames else None
            if top is not None and top.scalar and b in _SCALAR_END:
                dup |= _end_name(frames, item_value(top.item + data[starts[-1]:i]))
                top = frames[-1]
            i += 1
            if b == _QUOTE:
                string, lex = True, NORMAL
                buf, bound, raw = self._string_opens(frames, top)
            elif b in _OPEN:
                self._open(frames, b)
                starts.append(i)
            elif b in _CLOSE and frames:
                dup |= _close(frames, starts, data, i)
            elif b == _COMMA and frames:
                frames[-1] = _next_member(top)
                starts[-1] = i
            elif top is not None and top.unique and not top.scalar and b in _SCALAR_START:
                frames[-1] = top._replace(scalar=True)
        _keep_item_texts(frames, starts, data)
        return JsonTrack(tuple(frames), string, buf, lex, self.root, count, bound, raw), \
            broke, dup

    def _string_opens(self, frames: list, top: Frame | None) -> tuple:
        """A string opens in ``top``: (its text so far, kept for a key or an item of a unique
        array; the length bound the runtime enforces on it; its raw text, kept for the
        bound's pattern)."""
        key = top is not None and top.kind == _OBJ and top.expect_key
        buf = b"" if key or top is not None and top.unique else None
        if key or self.root is None:
            return buf, None, None
        bound = string_bound(self._position(frames))
        return buf, bound, b"" if bound is not None and bound[2] is not None else None

    def _open(self, frames: list, b: int) -> None:
        """``{`` or ``[`` opens a container (at the position ``frames`` are at)."""
        cands = self._position(frames)
        if b == _BRACE:
            frames.append(Frame(_OBJ, cands=cands))
            return
        unique = any(c.get(UNIQUE_MARK) for c in cands)
        frames.append(Frame(_ARR, unique=unique, cands=cands, item=b"" if unique else None,
                            domain=domain_of(cands) if unique else None))

    def repeats(self, data: bytes) -> bool:
        """True if ``data`` ends a key or a unique array's item its container already has."""
        return self._run(data)[2]

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
        end = scan(data, self.lex)[1]
        return end >= 0 and _decode(self.buf + data[:end]) in self.frames[-1].names

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
                        tuple(map(id, f.cands)), f.item if names else None, f.scalar,
                        f.done)
                       for f in self.frames)
        return frames, self.string, buf, self.lex, self._length_summary()

    def _length_summary(self) -> tuple | None:
        """The open string's bound as far as the future goes: characters still needed, and
        the room left (None when far: beyond that the room changes no completion)."""
        if self.bound is None:
            return None
        room, need = self.room_need()
        return max(need, 0), None if room is None or room > _FAR else room


def _breaks(bound: tuple, count: int, closed: bool) -> bool:
    """True if a string of ``count`` characters is past ``bound``'s maxLength, or ``closed``
    short of its minLength."""
    return bound[1] is not None and count > bound[1] or closed and count < bound[0]


def _end_name(frames: list, name: Any) -> bool:
    """The innermost container's current key or (unique) item is ``name``, now finished; True
    if it already had one equal."""
    top = frames[-1]
    frames[-1] = _closed(top, name)
    return name in top.names


def _close(frames: list, starts: list, data: bytes, i: int) -> bool:
    """``}`` or ``]`` (``data[i - 1]``) closes the innermost container: an item of a unique
    array ends there. True if that array already had one equal."""
    frames.pop()
    starts.pop()
    if not frames or not frames[-1].unique:
        return False
    return _end_name(frames, item_value(frames[-1].item + data[starts[-1]:i]))


def _next_member(top: Frame) -> Frame:
    """``,``: an object expects its next key, an array its next item."""
    if top.kind == _OBJ:
        return top._replace(expect_key=True)
    return top._replace(index=top.index + 1, item=b"" if top.unique else None, done=False)


def _keep_item_texts(frames: list, starts: list, data: bytes) -> None:
    """The unique arrays' open items keep their text (what ``data`` added to it)."""
    for d, f in enumerate(frames):
        if f.unique and starts[d] < len(data):
            frames[d] = f._replace(item=f.item + data[starts[d]:])


def _closed(frame: Frame, name: Any) -> Frame:
    if frame.kind == _OBJ:
        return frame._replace(names=frame.names | {name}, expect_key=False, last=name)
    return frame._replace(names=frame.names | {name}, scalar=False, done=True)


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
