"""FileStorage: the hierarchical cache's third tier, KV pages in files on a local disk.

A page is ``PAGE_TOKENS`` consecutive tokens at a page-aligned position of a prefix. Its key
is the page's *hash chain*: ``h_i = sha256(h_{i-1} || tokens of page i)``, with ``h_-1`` the
hash of the layout identity (model, weights, dtypes, layer/head shape), so the key fixes the
whole prefix up to the page's end and the layout it was computed with: a restarted engine, or
another engine on the same machine with the same model and layout, finds the pages by hashing
its own prompt. Under tensor parallelism each rank stores its own shard of a page (its KV
heads): the file name is the key plus the ``shard`` (``<hash>.tp<rank>of<size>.kv``, as
SGLang's HiCache storage suffixes keys with the TP rank), so a server with another TP size
never reads a shard layout it cannot use, and every rank of one server hashes the same keys.

File = header (JSON: magic, identity and shard, the page's token ids, payload length, CRC-32
of the payload) + payload (the page's KV rows, ``[layers, 2, PAGE_TOKENS, heads, head_dim]``).
A read checks every header field and the checksum; a file that fails (corrupt, truncated,
another layout) is logged, deleted and reported as a miss, never served.

Writes go to a background thread (checksum + write + rename, so a reader never sees a half
file); ``close`` drains it. The byte budget (pages x their KV bytes) is kept on the caller's
thread, in the order of its ``put``/``touch`` calls (an LRU list, oldest first): every TP rank
makes the same calls in the same order (the tree decides them), so every rank keeps and deletes
the same pages, whatever its writer thread's pace.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import struct
import threading
import zlib
from collections import OrderedDict
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

PAGE_TOKENS = 64
MAGIC = "sgdsl-hicache-v1"
_LEN = struct.Struct("<I")
_SUFFIX = ".kv"


class FileStorage:
    def __init__(self, directory: str | os.PathLike, identity: str, max_bytes: int,
                 row_shape: tuple[int, ...], dtype: torch.dtype, shard: str = "") -> None:
        """``shard``: this rank's part of a page (``tp0of2``; "" for a whole page)."""
        self.identity = identity
        self.root_hash = hashlib.sha256(identity.encode()).digest()
        self.dir = Path(directory) / self.root_hash.hex()[:16]
        self.dir.mkdir(parents=True, exist_ok=True)
        self.shard = shard
        self._suffix = f".{shard}{_SUFFIX}" if shard else _SUFFIX
        self._owner = f"{identity}|{shard}" if shard else identity  # in each header
        self.max_bytes = max_bytes
        self.row_shape = row_shape  # (layers, 2, PAGE_TOKENS, heads, head_dim)
        self.dtype = dtype
        self.page_bytes = int(torch.Size(row_shape).numel()) * _itemsize(dtype)
        # NOTE: LRU order, oldest first; a restart resumes it from the files' mtimes
        mine = [f for f in self.dir.glob(f"*{self._suffix}") if self._is_mine(f.name)]
        self._index: OrderedDict[str, None] = OrderedDict(
            (f.name, None) for f in sorted(mine, key=lambda f: f.stat().st_mtime))
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._writer = threading.Thread(target=self._write_loop, name="hicache-storage",
                                        daemon=True)
        self._writer.start()
        self.pages_written = self.pages_read = self.corrupt = self.bytes_written = 0
        self.bytes_read = 0
        self.unshared = 0  # pages dropped because another TP rank could not read its shard

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
        return self.dir / (h.hex() + self._suffix)

    def _is_mine(self, name: str) -> bool:
        """A file of this shard (``<hash>.kv`` must not take ``<hash>.tp0of2.kv``)."""
        return name.endswith(self._suffix) and "." not in name[:-len(self._suffix)]

    def exists(self, h: bytes) -> bool:
        """Whether the page's file is on disk (written by this engine or another)."""
        return self._path(h).exists()

    def has(self, h: bytes) -> bool:
        """Whether this storage holds (or is writing) the page: its own record, not the disk,
        so the answer follows the caller's calls only (the same on every TP rank)."""
        with self._lock:
            return self._path(h).name in self._index

    # -- write ----------------------------------------------------------------------------------
    def put(self, h: bytes, tokens: list[int], rows: torch.Tensor) -> None:
        """Queue one page (``rows``: ``row_shape``, a tensor this call may keep)."""
        assert tuple(rows.shape) == self.row_shape, (rows.shape, self.row_shape)
        self.touch(h)
        self._queue.put((h, list(tokens), rows))

    def touch(self, h: bytes) -> None:
        """Record the page as the most recently used (adding it), then keep the budget."""
        name = self._path(h).name
        with self._lock:
            self._index[name] = None
            self._index.move_to_end(name)
            while len(self._index) * self.page_bytes > self.max_bytes and len(self._index) > 1:
                old, _ = self._index.popitem(last=False)
                (self.dir / old).unlink(missing_ok=True)

    def forget(self, h: bytes, unshared: bool = False) -> None:
        """Delete the page (a miss from now on); ``unshared``: because another rank could not
        read its shard of it (counted)."""
        path = self._path(h)
        self.unshared += unshared
        with self._lock:
            self._index.pop(path.name, None)
            path.unlink(missing_ok=True)

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
        if path.exists():  # another engine (or this one, before a restart) wrote it
            return
        payload = rows.contiguous().view(torch.uint8).numpy().tobytes()
        header = json.dumps({"magic": MAGIC, "identity": self._owner, "tokens": tokens,
                             "bytes": len(payload), "crc32": zlib.crc32(payload)}).encode()
        tmp = path.with_suffix(f".tmp{os.getpid()}.{threading.get_ident()}")
        with open(tmp, "wb") as f:
            f.write(_LEN.pack(len(header)) + header + payload)
        with self._lock:
            # NOTE: the budget may have dropped the page while it was queued: not kept then
            if path.name not in self._index:
                tmp.unlink(missing_ok=True)
                return
            os.replace(tmp, path)
        self.pages_written += 1
        self.bytes_written += _LEN.size + len(header) + len(payload)

    # -- read -----------------------------------------------------------------------------------
    def get(self, h: bytes, tokens: list[int]) -> torch.Tensor | None:
        """``read``, and the page is touched (recently used) when it is served."""
        rows = self.read(h, tokens)
        if rows is not None:
            self.touch(h)
        return rows

    def read(self, h: bytes, tokens: list[int]) -> torch.Tensor | None:
        """The page's rows, or None (missing, or failed a check: logged and deleted). Not
        touched: under TP the caller first agrees with the other ranks on what is served."""
        path = self._path(h)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:  # NOTE: an unreadable disk is a miss, not a dead scheduler
            logger.warning("hicache storage: cannot read %s: %s", path.name, exc)
            return None
        reason = self._check(data, tokens)
        if reason is not None:
            logger.warning("hicache storage: skipping corrupt file %s (%s)", path.name, reason)
            self.corrupt += 1
            self.forget(h)
            return None
        try:
            os.utime(path)  # NOTE: a restart's LRU order starts from the files' mtimes
        except OSError:  # another engine's budget deleted it meanwhile: served all the same
            pass
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
        if not isinstance(header, dict):
            return "unreadable header"
        payload = memoryview(data)[_LEN.size + n:]
        expected = self.page_bytes
        if header.get("magic") != MAGIC or header.get("identity") != self._owner:
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
            files = len(self._index)
        size = files * self.page_bytes
        return {"hicache_storage_files": files, "hicache_storage_bytes": size,
                "hicache_storage_pages_written": self.pages_written,
                "hicache_storage_pages_read": self.pages_read,
                "hicache_bytes_storage_written": self.bytes_written,
                "hicache_bytes_storage_read": self.bytes_read,
                "hicache_storage_corrupt_files": self.corrupt,
                "hicache_storage_unshared_pages": self.unshared}


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
