"""The barrier-free one-shot all-reduce of a TP group (kernels/lamport_all_reduce.py): its
peer-mapped buffer, per-program call counters, and the optional fused residual add + RMSNorm.

Used by ``custom_all_reduce.SymmMemAllReduce`` for decode-sized messages (up to
``MAX_BYTES`` per rank); larger ones keep torch's one-/two-shot kernels or NCCL. The buffer is
torch symmetric memory (CUDA IPC, peer-to-peer loads and stores only, never multicast).
``SGDSL_DISABLE_LAMPORT_ALL_REDUCE=1`` turns it off (A/B runs).
"""
from __future__ import annotations

import logging
import os

import torch

from .state import TPGroup

logger = logging.getLogger(__name__)

# Per-rank message bytes served here: 64 rows of a 4096-wide bf16 model. The buffer holds two
# phases of one slot per rank: 2 x world x MAX_BYTES (4 MB at 4 ranks).
MAX_BYTES = 512 << 10
# A plain all-reduce takes it up to here; past it torch's two-shot is faster (2x H100: 16.2 vs
# 11.9 us at 512 KB) while the fused add + norm still wins (9.5 vs 15.6 us at 32 x 8192).
PLAIN_MAX_BYTES = 256 << 10
DTYPES = (torch.bfloat16, torch.float16)


class LamportAllReduce:
    def __init__(self, group: TPGroup, buffer: torch.Tensor, peer_ptrs_dev: int,
                 slot: int) -> None:
        from ..kernels.lamport_all_reduce import GRID

        self.group, self.buffer, self.peer_ptrs_dev, self.slot = group, buffer, peer_ptrs_dev, slot
        self.counters = torch.zeros(GRID, dtype=torch.int32, device=group.device)

    @classmethod
    def create(cls, group: TPGroup, max_bytes: int = MAX_BYTES) -> "LamportAllReduce | None":
        """None when switched off or when the buffer cannot be mapped (the caller then uses
        the symmetric-memory kernels alone)."""
        if os.environ.get("SGDSL_DISABLE_LAMPORT_ALL_REDUCE", "0") not in ("", "0"):
            return None
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        from ..kernels.lamport_all_reduce import EMPTY

        slot = max_bytes // 2
        try:
            buffer = symm_mem.empty(2 * group.size * slot, dtype=torch.int16,
                                    device=group.device)
            buffer.fill_(EMPTY)
            handle = symm_mem.rendezvous(buffer, group.group.group_name)
            if handle.buffer_ptrs[group.rank] != buffer.data_ptr():
                raise RuntimeError("the mapped buffer does not start at the tensor's address")
            peer_ptrs_dev = handle.buffer_ptrs_dev
        except Exception as e:  # noqa: BLE001 - IPC can be refused in many ways
            logger.warning("barrier-free all-reduce off (%s)", e)
            return None
        torch.cuda.synchronize(group.device)
        dist.barrier(group=group.group)  # every buffer is marked empty before anyone pushes
        return cls(group, buffer, peer_ptrs_dev, slot)

    def fits(self, x: torch.Tensor) -> bool:
        return x.dtype in DTYPES and x.is_contiguous() and x.numel() <= self.slot

    def prefers(self, x: torch.Tensor) -> bool:
        """Whether a plain all-reduce of ``x`` is fastest here (else torch's kernels)."""
        return self.fits(x) and x.numel() * x.element_size() <= PLAIN_MAX_BYTES

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        from ..kernels.lamport_all_reduce import lamport_all_reduce

        out = torch.empty_like(x)
        lamport_all_reduce(x, out, self.peer_ptrs_dev, self.counters, self.slot,
                           self.group.rank, self.group.size)
        return out

    def all_reduce_add_rmsnorm(self, x: torch.Tensor, residual: torch.Tensor,
                               weight: torch.Tensor, eps: float
                               ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rmsnorm(sum + residual) * weight, sum + residual)`` for ``x [rows, hidden]``."""
        from ..kernels.lamport_all_reduce import lamport_all_reduce

        out, res_out = torch.empty_like(x), torch.empty_like(residual)
        lamport_all_reduce(x, out, self.peer_ptrs_dev, self.counters, self.slot,
                           self.group.rank, self.group.size, residual=residual, weight=weight,
                           res_out=res_out, eps=eps)
        return out, res_out
