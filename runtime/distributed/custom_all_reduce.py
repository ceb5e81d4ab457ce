"""Custom all-reduce for decode-sized messages: one-shot / two-shot over NVLink peer-to-peer.

NCCL's ring/tree all-reduce pays a fixed latency of several microseconds per call; a decode step
of Llama-3.1-8B at TP=4 makes 64 of them on messages of 8 KB (batch 1) to ~1 MB, so that latency,
not the bytes, is what TP loses to. Here every rank owns a buffer that all peers map (torch's
symmetric memory: CUDA IPC handles exchanged once through the group's store), and a single kernel
per all-reduce copies the local input into its own buffer, meets the peers at a barrier over
signal pads, and then either
- one-shot: reads every peer's whole buffer and sums (one round trip; best for small messages),
- two-shot: reduces its 1/world share from all peers and writes the sums into every peer's
  buffer (reduce-scatter + all-gather over P2P; moves 2/world of the bytes per rank, for the
  mid sizes), then copies the result out.
Larger messages, other dtypes, and machines without P2P between all ranks stay on NCCL.

Only peer-to-peer loads and stores are used (``torch.ops.symm_mem.one_shot_all_reduce_copy_out``
/ ``two_shot_all_reduce_``), never NVLink multicast: rendezvous runs with
``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` unless the caller set it (multicast objects can take a
shared host's GPUs out of service, and nothing here needs them).

The kernels sync through signal pads on the device, so they are captured in CUDA graphs like
any other kernel; the buffer must exist before capture (``install`` from the model runner).
"""
from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass

import torch

from .lamport import DTYPES as LAMPORT_DTYPES
from .lamport import LamportAllReduce
from .state import TPGroup

logger = logging.getLogger(__name__)

# Message sizes (bytes) each algorithm takes by default. Measured on H100/H200 NVLink (see
# benchmarks/gpu/bench_all_reduce.py in RESULTS.md): one-shot wins up to a few hundred KB,
# two-shot in between, NCCL's bandwidth-optimal rings past a few MB.
ONE_SHOT_MAX_BYTES = {2: 1 << 20, 4: 512 << 10, 8: 256 << 10}
DEFAULT_MAX_BYTES = 8 << 20


@dataclass(frozen=True)
class AllReducePlan:
    """Which algorithm serves a message of ``nbytes``: 'one_shot', 'two_shot' or 'nccl'."""

    one_shot_max: int
    two_shot_max: int

    def choose(self, nbytes: int) -> str:
        if nbytes <= self.one_shot_max:
            return "one_shot"
        if nbytes <= self.two_shot_max:
            return "two_shot"
        return "nccl"


class SymmMemAllReduce:
    """The custom all-reduce of one process group; ``create`` returns None where it cannot
    work (no CUDA, no symmetric memory in this torch, no P2P between every pair of ranks)."""

    def __init__(self, group: TPGroup, buffer: torch.Tensor, plan: AllReducePlan,
                 lamport: LamportAllReduce | None = None) -> None:
        self.group, self.buffer, self.plan = group, buffer, plan
        self.group_name = group.group.group_name
        self.dtype = buffer.dtype
        self.lamport = lamport  # the barrier-free kernel for the smallest messages, if mapped
        # eager calls (not replays)
        self.calls = {"lamport": 0, "one_shot": 0, "two_shot": 0, "nccl": 0}

    @classmethod
    def create(cls, group: TPGroup, dtype: torch.dtype,
               max_bytes: int = DEFAULT_MAX_BYTES) -> "SymmMemAllReduce | None":
        if group.size == 1 or group.group is None or group.device.type != "cuda":
            return None
        why = _unsupported(group)
        if why:
            logger.warning("custom all-reduce off (%s): NCCL for every all-reduce", why)
            return None
        os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
        import torch.distributed._symmetric_memory as symm_mem

        try:
            name = group.group.group_name
            if hasattr(symm_mem, "enable_symm_mem_for_group"):
                with warnings.catch_warnings():  # deprecated (a no-op) in newer torch
                    warnings.simplefilter("ignore")
                    symm_mem.enable_symm_mem_for_group(name)
            buffer = symm_mem.empty(max_bytes // dtype.itemsize, dtype=dtype,
                                    device=group.device)
            symm_mem.rendezvous(buffer, name)
        except Exception as e:  # noqa: BLE001 - drivers/containers refuse IPC in many ways
            logger.warning("custom all-reduce off (symmetric memory rendezvous failed: %s)", e)
            return None
        one_shot = min(ONE_SHOT_MAX_BYTES.get(group.size, 256 << 10), max_bytes)
        logger.info("custom all-reduce on: %d ranks, one-shot <= %d B, two-shot <= %d B",
                    group.size, one_shot, max_bytes)
        lamport = LamportAllReduce.create(group) if dtype in LAMPORT_DTYPES else None
        return cls(group, buffer, AllReducePlan(one_shot, max_bytes), lamport)

    def can_run(self, x: torch.Tensor) -> bool:
        return (x.dtype == self.dtype and x.is_cuda and x.is_contiguous()
                and self.choose(x) != "nccl")

    def choose(self, x: torch.Tensor) -> str:
        if self.lamport is not None and self.lamport.prefers(x):
            return "lamport"
        nbytes = x.numel() * x.element_size()
        if nbytes % 16:  # NOTE: the kernels move 16-byte vectors
            return "nccl"
        algo = self.plan.choose(nbytes)
        if algo == "two_shot" and x.numel() % (self.group.size * 16 // x.element_size()):
            return "nccl"  # each rank's share must be whole vectors too
        return algo

    def all_reduce(self, x: torch.Tensor, algo: str | None = None) -> torch.Tensor:
        """The sum of ``x`` over the ranks, as a new tensor (``x`` is left as it was);
        ``algo`` forces 'lamport', 'one_shot' or 'two_shot' (benchmarks) instead of the plan's."""
        n = x.numel()
        algo = algo or self.choose(x)
        if not torch.cuda.is_current_stream_capturing():
            self.calls[algo] += 1
        if algo == "lamport":
            return self.lamport.all_reduce(x)
        flat, out = x.view(-1), torch.empty_like(x)
        if algo == "one_shot":
            torch.ops.symm_mem.one_shot_all_reduce_copy_out(
                self.buffer[:n], flat, "sum", self.group_name, out.view(-1))
            return out
        self.buffer[:n].copy_(flat)
        torch.ops.symm_mem.two_shot_all_reduce_(self.buffer[:n], "sum", self.group_name)
        out.view(-1).copy_(self.buffer[:n])
        return out


    def all_reduce_add_rmsnorm(self, x: torch.Tensor, residual: torch.Tensor,
                               weight: torch.Tensor, eps: float
                               ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(rmsnorm(sum(x) + residual) * weight, sum(x) + residual)`` in one kernel, or None
        where that kernel cannot take ``x`` (the caller reduces, then norms)."""
        if (self.lamport is None or x.dim() != 2 or not self.lamport.fits(x)
                or residual.dtype != x.dtype or not residual.is_contiguous()):
            return None
        if not torch.cuda.is_current_stream_capturing():
            self.calls["lamport"] += 1
        return self.lamport.all_reduce_add_rmsnorm(x, residual, weight, eps)


def _unsupported(group: TPGroup) -> str:
    """Why the custom all-reduce cannot run on this group ('' if it can)."""
    try:
        import torch.distributed._symmetric_memory  # noqa: F401
    except ImportError:
        return "this torch has no symmetric memory"
    if not hasattr(torch.ops.symm_mem, "one_shot_all_reduce_copy_out"):
        return "this torch lacks symm_mem.one_shot_all_reduce_copy_out"
    if group.size not in ONE_SHOT_MAX_BYTES:
        return f"{group.size} ranks (supported: {sorted(ONE_SHOT_MAX_BYTES)})"
    # every pair of GPUs this process sees must reach each other directly (NVLink or PCIe P2P);
    # a rank's peers are the other visible devices of its node in this runtime's launcher
    count = torch.cuda.device_count()
    if count < group.size:
        return "ranks on different nodes or devices hidden from each other"
    me = group.device.index or 0
    for other in range(count):
        if other != me and not torch.cuda.can_device_access_peer(me, other):
            return f"no peer-to-peer access between cuda:{me} and cuda:{other}"
    return ""


_INSTALLED: dict[int, SymmMemAllReduce] = {}


def install(group: TPGroup, dtype: torch.dtype, max_bytes: int = DEFAULT_MAX_BYTES) -> bool:
    """Create the custom all-reduce of ``group`` (once; before any CUDA graph capture).
    True when it is on; ``collectives.all_reduce`` then routes small messages to it."""
    key = id(group.group)
    if key not in _INSTALLED:
        ar = SymmMemAllReduce.create(group, dtype, max_bytes)
        if ar is None:
            return False
        _INSTALLED[key] = ar
    return True


def lookup(group: TPGroup) -> SymmMemAllReduce | None:
    return _INSTALLED.get(id(group.group)) if _INSTALLED else None


def uninstall_all() -> None:
    _INSTALLED.clear()
