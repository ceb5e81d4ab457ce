"""GrammarDiskCache: compiled grammars kept on disk, so a restarted engine and every replica on
the machine reuse compiles instead of repeating them.

A file holds exactly what a compile worker sends back (the backend's ``serialize``d compiled
grammar: xgrammar's JSON with the JSON filter flag; outlines' pickled index with its
forced-prefix cache and completion table), so a hit is rebuilt by the same ``deserialize`` as a
fresh compile and behaves the same. Its name is a hash of the constraint and the cache's
identity (``cache_identity.py``: backend and version, tokenizer, compile code), under a folder
per backend::

    <root>/<backend>/<sha256 of identity, kind, text>.grammar
    file = MAGIC | key digest (32) | payload sha256 (32) | payload length (8) | payload

- Writes go to a temporary file in the same folder, then ``os.replace``: a reader (another
  replica) sees the old file, the new one, or none, never half of one.
- A file whose header, length or checksum is wrong (truncated, corrupted, another key's) is
  ignored with a warning and recompiled; the recompile's store replaces it.
- The folder is bounded by ``max_bytes``: past it, the least recently used files (mtime, which a
  hit refreshes: ``noatime`` mounts keep no access time) go until it is under 80% of the budget.
- Only successes are stored: a rejected constraint, a deadline or a memory verdict is decided
  again (they depend on limits and load, and an invalid schema fails fast anyway).
- Payloads are unpickled (outlines), so the root must be ours alone: it is created ``0700``;
  a root owned by another user, or writable by group or others, disables the cache with a
  warning.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import stat
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from ..base import GrammarKey

logger = logging.getLogger(__name__)

MAGIC = b"SGDSLGC\x01"
_HEAD = struct.Struct(">8s32s32sQ")  # magic, key digest, payload sha256, payload length
SUFFIX = ".grammar"
ENV_DIR = "SGDSL_GRAMMAR_CACHE_DIR"
ENV_SWITCH = "SGDSL_GRAMMAR_DISK_CACHE"  # "0": off unless a config names its folder (tests)
_LOW_WATER = 0.8  # eviction goes down to this share of the budget (not one file per store)
_STALE_TMP_S = 3600.0  # a temporary file this old was left by a writer that died


def default_cache_dir() -> Path:
    """``$SGDSL_GRAMMAR_CACHE_DIR``, else ``$XDG_CACHE_HOME/sgdsl/grammars``, else
    ``~/.cache/sgdsl/grammars``."""
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sgdsl" / "grammars"


@dataclass
class DiskCacheStats:
    hits: int = 0
    misses: int = 0
    errors: int = 0  # unreadable, corrupted or unloadable files, failed writes
    writes: int = 0
    evictions: int = 0


class GrammarDiskCache:
    """One backend's compiled grammars under ``root`` (see the module doc). ``identity``: the
    ``cache_identity`` digest, or a picklable function computing it (called once, lazily)."""

    def __init__(self, root: str | os.PathLike, backend: str, identity: str | Callable[[], str],
                 max_bytes: int = 1 << 30) -> None:
        self.root = Path(root)
        self.folder = self.root / backend
        self.max_bytes = max_bytes
        self.stats = DiskCacheStats()
        self._identity = identity
        self._lock = threading.Lock()
        self._total: int | None = None  # bytes under root, as last counted plus our writes
        self.disabled: str | None = None  # why the cache is off (None: on)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["_lock"]
        state["stats"], state["_total"] = DiskCacheStats(), None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def identity(self) -> str:
        if callable(self._identity):
            self._identity = self._identity()
        return self._identity

    def open(self) -> bool:
        """Create the folder (``0700``) and check it is ours alone; False (and ``disabled``
        says why, logged once) if the cache cannot be used."""
        if self.disabled is not None:
            return False
        try:
            # NOTE: the root itself 0700 too (a parent made by mkdir(parents=True) gets the
            # umask's mode, group-writable under a 002 umask)
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.folder.mkdir(exist_ok=True, mode=0o700)
            problem = _unsafe(self.root) or _unsafe(self.folder)
        except OSError as e:
            problem = f"cannot create it: {e}"
        if problem is not None:
            self.disabled = problem
            logger.warning("grammar disk cache off: %s %s", self.root, problem)
            return False
        return True

    def path(self, key: GrammarKey) -> Path:
        return self.folder / (self._digest(key).hex() + SUFFIX)

    def load(self, key: GrammarKey) -> bytes | None:
        """The stored payload of ``key``, or None (missing, or bad: logged and ignored)."""
        if not self.open():
            return None
        path = self.path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            self._count("misses")
            return None
        except OSError as e:
            return self._bad(path, f"unreadable: {e}")
        why, payload = self._check(key, data)
        if why is not None:
            return self._bad(path, why)
        try:
            os.utime(path)  # the LRU clock
        except OSError:
            pass
        self._count("hits")
        return payload

    def names(self) -> list[str]:
        """The file names in this backend's folder (opening the cache first)."""
        if not self.open():
            return []
        try:
            return [e.name for e in os.scandir(self.folder) if e.name.endswith(SUFFIX)]
        except OSError:
            return []

    def store(self, key: GrammarKey, payload: bytes) -> bool:
        """Write ``payload`` as ``key``'s file (atomically), then keep the folder in budget.
        True if files were evicted for it."""
        size = _HEAD.size + len(payload)
        if not self.open() or size > self.max_bytes:
            return False
        path = self.path(key)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        head = _HEAD.pack(MAGIC, self._digest(key), hashlib.sha256(payload).digest(),
                          len(payload))
        try:
            with open(tmp, "wb") as f:
                f.write(head)
                f.write(payload)
            os.replace(tmp, path)
        except OSError as e:
            self._count("errors")
            logger.warning("grammar disk cache: cannot write %s: %s", path, e)
            _unlink(tmp)
            return False
        self._count("writes")
        with self._lock:
            self._total = None if self._total is None else self._total + size
        evictions = self.stats.evictions
        if self._total is None or self._total > self.max_bytes:
            self.evict()
        return self.stats.evictions > evictions

    def evict(self) -> int:
        """Count the files under ``root``; past the budget, delete the least recently used
        until under ``_LOW_WATER`` of it. Returns the bytes left."""
        files = []
        now = time.time()
        for entry in _scan(self.root):
            try:
                st = entry.stat()
            except OSError:
                continue  # evicted meanwhile by another replica
            if entry.name.endswith(".tmp"):
                if now - st.st_mtime > _STALE_TMP_S:
                    _unlink(entry.path)
                continue
            files.append((st.st_mtime, st.st_size, entry.path))
        total = sum(size for _, size, _ in files)
        if total > self.max_bytes:
            for _, size, path in sorted(files):
                if total <= self.max_bytes * _LOW_WATER:
                    break
                if _unlink(path):
                    self._count("evictions")
                total -= size
        with self._lock:
            self._total = total
        return total

    def _digest(self, key: GrammarKey) -> bytes:
        h = hashlib.sha256(self.identity.encode("ascii") + b"\0")
        h.update(key.kind.encode("utf-8") + b"\0" + key.text.encode("utf-8"))
        return h.digest()

    def _check(self, key: GrammarKey, data: bytes) -> tuple[str | None, bytes]:
        """(what is wrong with ``data`` as ``key``'s file or None, its payload)."""
        if len(data) < _HEAD.size:
            return f"truncated ({len(data)} bytes)", b""
        magic, digest, checksum, length = _HEAD.unpack_from(data)
        payload = data[_HEAD.size:]
        if magic != MAGIC:
            return "not a grammar cache file (bad magic)", b""
        if digest != self._digest(key):
            return "holds another constraint", b""
        if len(payload) != length:
            return f"truncated ({len(payload)} of {length} payload bytes)", b""
        if hashlib.sha256(payload).digest() != checksum:
            return "checksum mismatch (corrupted)", b""
        return None, payload

    def _bad(self, path: Path, why: str) -> None:
        self._count("errors")
        logger.warning("grammar disk cache: ignoring %s: %s; it is compiled again", path, why)
        return None

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + 1)

    def stats_dict(self) -> dict[str, int]:
        s = self.stats
        return {"grammar_disk_cache_hits": s.hits, "grammar_disk_cache_misses": s.misses,
                "grammar_disk_cache_errors": s.errors, "grammar_disk_cache_writes": s.writes,
                "grammar_disk_cache_evictions": s.evictions}


def _unsafe(folder: Path) -> str | None:
    """Why ``folder`` may not hold files we unpickle, or None."""
    st = folder.stat()
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"is owned by uid {st.st_uid}, not by this user"
    if st.st_mode & 0o022:
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _scan(root: Path) -> list[os.DirEntry]:
    """The cache files and temporary files under ``root`` (one folder per backend)."""
    found: list[os.DirEntry] = []
    try:
        folders = [e for e in os.scandir(root) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return found
    for folder in folders:
        try:
            found += [e for e in os.scandir(folder.path) if e.is_file(follow_symlinks=False)
                      and (e.name.endswith(SUFFIX) or e.name.endswith(".tmp"))]
        except OSError:
            continue
    return found


def _unlink(path: Any) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:
        return False


def disk_cache_from_config(config: Any, backend: Any) -> GrammarDiskCache | None:
    """The cache an ``EngineConfig`` asks for (``grammar_cache_dir``, ``grammar_cache_bytes``,
    ``disable_grammar_disk_cache``) for ``backend``; None when off or the backend has no
    ``spec`` to identify it by. ``$SGDSL_GRAMMAR_DISK_CACHE=0`` turns the default folder off
    (a ``grammar_cache_dir`` given explicitly still counts)."""
    from ...errors import InvalidRequestError
    from .cache_identity import cache_identity

    if getattr(config, "disable_grammar_disk_cache", False) or backend.spec is None:
        return None
    budget = getattr(config, "grammar_cache_bytes", 1 << 30)
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
        raise InvalidRequestError(f"grammar_cache_bytes must be an integer >= 0, not "
                                  f"{budget!r}", field="grammar_cache_bytes")
    explicit = getattr(config, "grammar_cache_dir", None)
    if budget == 0 or not explicit and os.environ.get(ENV_SWITCH, "1").lower() in (
            "0", "false", "off", "no"):
        return None
    root = explicit or default_cache_dir()
    return GrammarDiskCache(Path(root).expanduser(), backend.name,
                            functools.partial(cache_identity, backend.spec), budget)
