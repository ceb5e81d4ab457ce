"""FileStorage: the hierarchical cache's third tier, KV pages in files on a local disk.

A page is ``PAGE_TOKENS`` consecutive tokens at a page-aligned position of a prefix. Its file
is named by the page's *hash chain*: ``h_i = sha256(h_{i-1} || tokens of page i)``, with
``h_-1`` the hash of the layout identity (model, weights, dtypes, layer/head shape, TP rank), so
the name fixes the whole prefix up to the page's end and the layout it was computed with: a
restarted engine, or another engine on the same machine with the same model and layout, finds
the pages by hashing its own prompt.

File = header (JSON: magic, identity, the page's token ids, payload length, CRC-32 of the
payload) + payload (the page's KV rows, ``[layers, 2, PAGE_TOKENS, heads, head_dim]``). A read
checks every header field and the checksum; a file that fails (corrupt, truncated, another
layout) is logged, deleted and reported as a miss, never served.

Writes go to a background thread (checksum + write + rename, so a reader never sees a half
file); ``close`` drains it. The directory has a byte budget: past it the least recently used
files (by mtime; a read touches its file) are deleted.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import struct
import threading
import time
import zlib
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

PAGE_TOKENS = 64
MAGIC = "sgdsl-hicache-v1"
_LEN = struct.Struct("<I")
_SUFFIX = ".kv"


class FileStorage:
    def __init__(self, directory: str | os.PathLike, identity: str, max_bytes: int,
                 row_shape: tuple[int, ...], dtype: torch.dtype) -> None:
        self.identity = identity
        self.root_hash = hashlib.sha256(identity.encode()).digest()
        self.dir = Path(directory) / self.root_hash.hex()[:16]
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.row_shape = row_shape  # (layers, 2, PAGE_TOKENS, heads, head_dim)
        self.dtype = dtype
        self._index: dict[str, tuple[float, int]] = {}  # name -> (mtime, bytes)
        for path in self.dir.glob(f"*{_SUFFIX}"):
            st = path.stat()
            self._index[path.name] = (st.st_mtime, st.st_size)
        self._clock = max((t for t, _ in self._index.values()), default=0.0)
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._writer = threading.Thread(target=self._write_loop, name="hicache-storage",
                                        daemon=True)
        self._writer.start()
        self.pages_written = self.pages_read = self.corrupt = self.bytes_written = 0
        self.bytes_read = 0

    # -- keys -----------------------------------------------------------------------------------
    def page_hashes(self, token_ids: list[int], num_pages: int) -> list[bytes]:
        """Hash chain of the first ``num_pages`` full pages of ``token_ids``."""
        out, h = [], self.root_hash
        for p in range(num_pages):
            page = token_ids[p * PAGE_TOKENS:(p + 1) * PAGE_TOKENS]
            h = hashlib.sha256(h + struct.pack(f"<{len(page)}q", *page)).digest()
            out.append(h)
        return out

    def _path(self, h: bytes) -> Path:
        return self.dir / (h.hex() + _SUFFIX)

    def exists(self, h: bytes) -> bool:
        return self._path(h).exists()

    # -- write ----------------------------------------------------------------------------------
    def put(self, h: bytes, tokens: list[int], rows: torch.Tensor) -> None:
        """Queue one page (``rows``: ``row_shape``, a tensor this call may keep)."""
        assert tuple(rows.shape) == self.row_shape, (rows.shape, self.row_shape)
        self._queue.put((h, list(tokens), rows))

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._write(*item)
            except OSError as exc:  # a full or read-only disk must not kill the scheduler
                logger.warning("hicache storage: write failed: %s", exc)
            finally:
                self._queue.task_done()

    def _write(self, h: bytes, tokens: list[int], rows: torch.Tensor) -> None:
        path = self._path(h)
        if path.exists():
            return
        payload = rows.contiguous().view(torch.uint8).numpy().tobytes()
        header = json.dumps({"magic": MAGIC, "identity": self.identity, "tokens": tokens,
                             "bytes": len(payload), "crc32": zlib.crc32(payload)}).encode()
        tmp = path.with_suffix(f".tmp{os.getpid()}.{threading.get_ident()}")
        with open(tmp, "wb") as f:
            f.write(_LEN.pack(len(header)) + header + payload)
        os.replace(tmp, path)
        size = path.stat().st_size
        with self._lock:
            self._index[path.name] = (self._now(), size)
            self.pages_written += 1
            self.bytes_written += size
        self._enforce_budget()

    def _now(self) -> float:
        """A recency stamp later than every earlier one (mtimes can tie within a tick)."""
        self._clock = max(time.time(), self._clock + 1e-6)
        return self._clock

    def _enforce_budget(self) -> None:
        with self._lock:
            total = sum(size for _, size in self._index.values())
            if total <= self.max_bytes:
                return
            for name, (_, size) in sorted(self._index.items(), key=lambda kv: kv[1][0]):
                if total <= self.max_bytes:
                    break
                (self.dir / name).unlink(missing_ok=True)
                del self._index[name]
                total -= size

    # -- read -----------------------------------------------------------------------------------
    def get(self, h: bytes, tokens: list[int]) -> torch.Tensor | None:
        """The page's rows, or None (missing, or failed a check: logged and deleted)."""
        path = self._path(h)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        reason = self._check(data, tokens)
        if reason is not None:
            logger.warning("hicache storage: skipping corrupt file %s (%s)", path.name, reason)
            self.corrupt += 1
            path.unlink(missing_ok=True)
            with self._lock:
                self._index.pop(path.name, None)
            return None
        os.utime(path)  # LRU: a read page is recent
        with self._lock:
            self._index[path.name] = (self._now(), len(data))
        self.pages_read += 1
        self.bytes_read += len(data)
        (n,) = _LEN.unpack_from(data)
        payload = bytearray(data[_LEN.size + n:])
        return torch.frombuffer(payload, dtype=torch.uint8).view(self.dtype).view(self.row_shape)

    def _check(self, data: bytes, tokens: list[int]) -> str | None:
        if len(data) < _LEN.size:
            return "truncated header"
        (n,) = _LEN.unpack_from(data)
        try:
            header = json.loads(data[_LEN.size:_LEN.size + n])
        except ValueError:
            return "unreadable header"
        payload = memoryview(data)[_LEN.size + n:]
        expected = int(torch.Size(self.row_shape).numel()) * _itemsize(self.dtype)
        if header.get("magic") != MAGIC or header.get("identity") != self.identity:
            return "another format or layout"
        if header.get("tokens") != list(tokens):
            return "token ids differ"
        if header.get("bytes") != expected or len(payload) != expected:
            return f"payload {len(payload)} bytes, expected {expected}"
        if zlib.crc32(payload) != header.get("crc32"):
            return "checksum mismatch"
        return None

    # -- lifecycle ------------------------------------------------------------------------------
    def flush(self) -> None:
        self._queue.join()

    def close(self) -> None:
        if self._writer.is_alive():
            self._queue.put(None)
            self._writer.join()

    def stats(self) -> dict[str, int]:
        with self._lock:
            files, size = len(self._index), sum(s for _, s in self._index.values())
        return {"hicache_storage_files": files, "hicache_storage_bytes": size,
                "hicache_storage_pages_written": self.pages_written,
                "hicache_storage_pages_read": self.pages_read,
                "hicache_bytes_storage_written": self.bytes_written,
                "hicache_bytes_storage_read": self.bytes_read,
                "hicache_storage_corrupt_files": self.corrupt}


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
