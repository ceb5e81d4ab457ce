"""KV move: copy scattered KV rows between the device pool and the page-locked host pool in one
launch, the kernel reading or writing host memory itself (zero-copy over UVA), as SGLang's
kvcacheio ``transfer_kv_per_layer`` / ``transfer_kv_all_layer`` do.

A move of ``n`` tokens over ``L`` layers was ``L x 2 x runs`` ``copy_`` launches plus a gather
or scatter per layer (hundreds to thousands of launches, ~13 ms of host time per load of the
chat benchmark); here it is one launch per layer (a load: an event after each, for the
layer-wise overlap) or one for every layer (a backup).

Rows move as raw words (fp8 and bf16 alike: no conversion). The device pool's per-layer
buffers are separate allocations, so the kernel finds layer ``l``'s K (V) buffer in a table of
their addresses (``DevPtrs[2 l]``, ``DevPtrs[2 l + 1]``); the host pool is one tensor
``[L, 2, slots, heads, dim]``, addressed from its base. The host tensor is a kernel argument,
so Triton's launcher asks the driver for its device address (``cuPointerGetAttribute``): a
page-locked mapped buffer has one, pageable memory raises ``ValueError`` (the caller then
keeps its plain copies)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_BLOCK = 1024  # words one program moves per iteration


# NOTE: the slot ids' and the plane's alignment vary from move to move (an index tensor is a
# row of a [2, n] one; plane0 = 2 x layer): specializing on them would compile new variants in
# the middle of serving; the host base, the address table and the row size are fixed per pool.
@triton.jit(do_not_specialize=["DevIdx", "HostIdx", "plane0"])
def _kv_move_kernel(Host, DevPtrs, DevIdx, HostIdx, plane0, host_plane_words, row_words,
                    TO_HOST: tl.constexpr, BLOCK: tl.constexpr):
    # program (token t, plane p): one row of plane0 + p, a plane being one layer's K or V
    tok = tl.program_id(0).to(tl.int64)
    plane = plane0 + tl.program_id(1).to(tl.int64)
    dev = tl.load(DevPtrs + plane).to(tl.pointer_type(Host.dtype.element_ty))
    dev = tl.multiple_of(dev, 16)  # torch allocations are 512-byte aligned: wide accesses
    dev_row = dev + tl.load(DevIdx + tok).to(tl.int64) * row_words
    host_row = Host + plane * host_plane_words + tl.load(HostIdx + tok).to(tl.int64) * row_words
    for start in range(0, row_words, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < row_words
        if TO_HOST:
            tl.store(host_row + offs, tl.load(dev_row + offs, mask=mask), mask=mask)
        else:
            tl.store(dev_row + offs, tl.load(host_row + offs, mask=mask), mask=mask)


def word_dtype(row_bytes: int) -> torch.dtype:
    """The widest integer that divides a row (rows move as whole words)."""
    for dtype in (torch.int64, torch.int32, torch.int16):
        if row_bytes % dtype.itemsize == 0:
            return dtype
    return torch.uint8


def as_words(t: torch.Tensor, word: torch.dtype) -> torch.Tensor:
    """A contiguous buffer's bytes as a flat tensor of ``word``."""
    assert t.is_contiguous()
    return t.reshape(-1).view(torch.uint8).view(word)


def move_rows(host: torch.Tensor, dev_ptrs: torch.Tensor, dev_idx: torch.Tensor,
              host_idx: torch.Tensor, planes: tuple[int, int], row_words: int,
              host_plane_words: int, to_host: bool) -> None:
    """For planes ``planes[0] .. planes[1]-1`` (plane ``2 l + w``: layer ``l``'s K (w=0) or V)
    and every ``t``: host row ``host_idx[t]`` of the plane <- device row ``dev_idx[t]``
    (``to_host``) or the reverse. ``host``: the host pool's words (``as_words``);
    ``dev_ptrs``: int64 device addresses of each plane's device buffer, on the device;
    ``dev_idx``/``host_idx``: slot ids on the device (the kernel reads them)."""
    n, count = int(dev_idx.numel()), planes[1] - planes[0]
    assert host_idx.numel() == n and dev_idx.dtype == host_idx.dtype == torch.int64
    if n == 0 or count == 0:
        return
    block = min(triton.next_power_of_2(row_words), MAX_BLOCK)
    _kv_move_kernel[(n, count)](host, dev_ptrs, dev_idx, host_idx, planes[0], host_plane_words,
                                row_words, TO_HOST=to_host, BLOCK=block,
                                num_warps=4 if block >= 256 else 1)
