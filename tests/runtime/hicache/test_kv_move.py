"""The KV move kernel (kernels/kv_move.py) and KVTransfer's kernel path, on the CPU: Triton's
interpreter runs the kernel over CPU pools (it dereferences the raw addresses it is given, as
the GPU does over UVA), and a stand-in CUDA api gives the transfer its streams and events.
Random scattered slots, bf16 and fp8 pools and an odd row size (int32 words): a backup then a
load leave every row equal to the plain copies' result. The GPU half is test_hicache_gpu.py."""
from __future__ import annotations

import contextlib

import pytest
import torch

triton = pytest.importorskip("triton")
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from sgdsl.runtime.cache.hicache.kernel_io import KernelIO  # noqa: E402
from sgdsl.runtime.cache.hicache.transfer import KVTransfer  # noqa: E402
from sgdsl.runtime.cache.host_pool import HostKVPool  # noqa: E402
from sgdsl.runtime.cache.pool import TokenKVPool, _raw  # noqa: E402
from sgdsl.runtime.kernels import kv_move  # noqa: E402

LAYERS = 3


@pytest.fixture(autouse=True)
def _interpreted(monkeypatch):
    monkeypatch.setattr(kv_move, "_kv_move_kernel",
                        InterpretedFunction(kv_move._kv_move_kernel.fn))


class _Event:
    def __init__(self, enable_timing: bool = False) -> None:
        self.recorded = False

    def record(self, stream=None) -> None:
        self.recorded = True

    def query(self) -> bool:
        return self.recorded  # the interpreter ran the copy before record()

    def synchronize(self) -> None:
        assert self.recorded

    def elapsed_time(self, other: "_Event") -> float:
        return 0.5


class _Stream:
    def __init__(self, device=None) -> None:
        self.waits = 0

    def wait_stream(self, other) -> None:
        self.waits += 1

    def wait_event(self, event) -> None:
        self.waits += 1


class _Api:
    """What KVTransfer asks of ``torch.cuda``, run at once on the CPU."""
    Event, Stream = _Event, _Stream

    def __init__(self) -> None:
        self.main = _Stream()

    def current_stream(self, device=None) -> _Stream:
        return self.main

    @contextlib.contextmanager
    def stream(self, stream: _Stream):
        yield


def _pools(dtype: torch.dtype, heads: int, dim: int, lockstep: bool = False
           ) -> tuple[TokenKVPool, HostKVPool, KVTransfer]:
    dev = TokenKVPool(64, LAYERS, heads, dim, dtype, "cpu")
    host = HostKVPool(96, dev, pin_memory=False)
    gen = torch.Generator().manual_seed(0)
    for buf in (*dev.k_buffer, *dev.v_buffer):  # random bytes: every row, layer, K/V distinct
        raw = _raw(buf).view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))
    moves = KVTransfer(dev, host, api=_Api(), lockstep=lockstep)
    assert moves.io is None  # a stand-in api over CPU pools: no kernel unless given one
    moves.io = KernelIO(dev, host)
    return dev, host, moves


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return _raw(t).view(torch.uint8)


SHAPES = {"bf16": (torch.bfloat16, 2, 8), "fp8": (torch.float8_e4m3fn, 2, 8),
          "odd-row": (torch.bfloat16, 1, 6)}  # 12-byte rows: int32 words


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("lockstep", [False, True])
def test_backup_then_load_moves_scattered_rows(shape, lockstep):
    dtype, heads, dim = SHAPES[shape]
    dev, host, moves = _pools(dtype, heads, dim, lockstep)
    assert moves.io.word == (torch.int32 if shape == "odd-row" else torch.int64)
    gen = torch.Generator().manual_seed(1)
    src = torch.randperm(64, generator=gen)[:24] + 1  # device slots 1..64, any order
    held = torch.randperm(96, generator=gen)[:24]  # host slots, scattered
    landed = []
    backup = moves.backup(src, held, lambda: landed.append(True))
    assert backup is not None and not landed  # pending until polled, as on CUDA
    for _ in range(2):
        moves.tick()
    moves.poll()
    assert landed == [True] and backup.landed and not moves.pending
    for layer in range(LAYERS):
        assert torch.equal(_bytes(host.k_buffer[layer][held]), _bytes(dev.k_buffer[layer][src]))
        assert torch.equal(_bytes(host.v_buffer[layer][held]), _bytes(dev.v_buffer[layer][src]))
    untouched = torch.ones(96, dtype=torch.bool)
    untouched[held] = False
    assert not _bytes(host._store[:, :, untouched]).any()  # no other host row written
    back = torch.randperm(64, generator=gen)[:24] + 1
    want = [(dev.k_buffer[layer][src].clone(), dev.v_buffer[layer][src].clone())
            for layer in range(LAYERS)]
    end = moves.load(held, back, [backup.event])
    assert end is not None and len(dev._layer_events[-1]) == LAYERS  # an event per layer
    for layer, (k, v) in enumerate(want):
        assert torch.equal(_bytes(dev.k_buffer[layer][back]), _bytes(k))
        assert torch.equal(_bytes(dev.v_buffer[layer][back]), _bytes(v))
    stats = moves.stats()
    assert stats["hicache_io_kernel"] == 1 and stats["hicache_loads_total"] == 1
    assert stats["hicache_direct_moves_total"] == 0  # no plain copies ran


def test_move_rows_plane_range_and_empty_moves():
    """A load's per-layer launch touches its layer's two planes only; nothing to move is no
    launch at all."""
    dev, host, moves = _pools(torch.bfloat16, 2, 8)
    idx = torch.stack([torch.tensor([5, 9]), torch.tensor([70, 3])])
    io = moves.io
    kv_move.move_rows(io.host_words, io.dev_ptrs, idx[0], idx[1], (2, 4), io.row_words,
                      io.host_plane_words, to_host=True)  # layer 1's K and V only
    for layer in range(LAYERS):
        for buf, dbuf in ((host.k_buffer, dev.k_buffer), (host.v_buffer, dev.v_buffer)):
            assert torch.equal(_bytes(buf[layer][idx[1]]),
                               _bytes(dbuf[layer][idx[0]]) if layer == 1
                               else torch.zeros_like(_bytes(buf[layer][idx[1]])))
    empty = torch.empty(0, dtype=torch.int64)
    kv_move.move_rows(io.host_words, io.dev_ptrs, empty, empty, (0, 6), io.row_words,
                      io.host_plane_words, to_host=False)


def test_create_keeps_plain_copies_off_cuda():
    """``KernelIO.create`` only takes a CUDA pool with a page-locked host pool."""
    dev = TokenKVPool(8, 1, 1, 4, torch.float32, "cpu")
    assert KernelIO.create(dev, HostKVPool(16, dev, pin_memory=False)) is None
    assert KVTransfer(dev, HostKVPool(16, dev, pin_memory=False)).io is None


def test_direct_backend_keeps_plain_copies(monkeypatch):
    """``hicache_io_backend="direct"`` never builds the kernel path (on CUDA pools either:
    ``create`` returns before looking at the pools' device)."""
    built = []
    monkeypatch.setattr(KernelIO, "__init__", lambda self, *a: built.append(a))
    dev = TokenKVPool(8, 1, 1, 4, torch.float32, "cpu")
    host = HostKVPool(16, dev, pin_memory=False)
    monkeypatch.setattr(host, "pinned", True)
    monkeypatch.setattr(dev, "device", torch.device("cuda"))
    assert KernelIO.create(dev, host, "direct") is None and built == []


def test_grouped_load_gives_each_layer_its_group_event():
    """``load_group`` layers per launch: every layer still gets an event (its group's), and
    the rows land as with one launch per layer."""
    dev, host, moves = _pools(torch.bfloat16, 2, 8)
    moves.io.load_group = 2
    src, held = torch.tensor([7, 3, 40]), torch.tensor([90, 2, 31])
    backup = moves.backup(src, held, lambda: None)
    back = torch.tensor([50, 51, 12])
    moves.load(held, back, [backup.event])
    events = dev._layer_events[-1]
    assert len(events) == LAYERS and events[0] is events[1] and events[2] is not events[0]
    for layer in range(LAYERS):
        assert torch.equal(_bytes(dev.k_buffer[layer][back]), _bytes(dev.k_buffer[layer][src]))
        assert torch.equal(_bytes(dev.v_buffer[layer][back]), _bytes(dev.v_buffer[layer][src]))
