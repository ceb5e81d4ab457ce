"""Apply a packed grammar bitmask to a batch of logits in one vectorized op.

Layout (xgrammar's and outlines-core's): ``bitmask[r, w]`` is an int32 whose bit ``b`` says
whether token ``32 * w + b`` is allowed for row ``r``. Disallowed logits become ``-inf``. No
Python loop over requests or the vocabulary: the words are unpacked with one shift-and-mask and
the whole batch is filled with one ``masked_fill_``.
"""
from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)
_SHIFTS: dict[torch.device, torch.Tensor] = {}


def _shifts(device: torch.device) -> torch.Tensor:
    t = _SHIFTS.get(device)
    if t is None:
        t = _SHIFTS[device] = torch.arange(32, dtype=torch.int32, device=device)
    return t


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(rows, words) int32 -> (rows, vocab_size) bool, True = allowed. Ids past the bitmask's
    32 * words are disallowed (a padded lm_head never samples a token the tokenizer lacks)."""
    bits = (bitmask.unsqueeze(-1) >> _shifts(bitmask.device)) & 1
    return fit_vocab(bits.flatten(-2).bool(), vocab_size)


def fit_vocab(allowed: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """A bool (rows, n) allowed-mask cut or padded (with False: disallowed) to ``vocab_size``."""
    width = allowed.shape[-1]
    if width >= vocab_size:
        return allowed[..., :vocab_size]
    pad = torch.zeros(*allowed.shape[:-1], vocab_size - width, dtype=torch.bool,
                      device=allowed.device)
    return torch.cat([allowed, pad], dim=-1)


def apply_token_bitmask_(logits: torch.Tensor, bitmask: torch.Tensor,
                         rows: torch.Tensor | None = None) -> torch.Tensor:
    """Set disallowed logits to -inf in place and return ``logits``.

    ``logits``: (batch, vocab) float. ``bitmask``: (batch, words) int32, or (len(rows), words)
    when ``rows`` (int64 indices into the batch) names the constrained rows so unconstrained
    rows cost nothing. The bitmask is moved to the logits' device if needed.
    """
    if bitmask.dtype != torch.int32 or bitmask.dim() != 2:
        raise ValueError(f"bitmask must be a 2-D int32 tensor, got {bitmask.dtype} "
                         f"{tuple(bitmask.shape)}")
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D (batch, vocab), got {tuple(logits.shape)}")
    bitmask = bitmask.to(logits.device, non_blocking=True)
    if rows is None:
        if bitmask.shape[0] != logits.shape[0]:
            raise ValueError(f"bitmask has {bitmask.shape[0]} rows for {logits.shape[0]} logits")
        logits.masked_fill_(~unpack_bitmask(bitmask, logits.shape[-1]), float("-inf"))
        return logits
    rows = rows.to(logits.device)
    if rows.numel() != bitmask.shape[0]:
        raise ValueError(f"{rows.numel()} rows for a bitmask of {bitmask.shape[0]} rows")
    if rows.numel():
        sub = logits.index_select(0, rows)
        sub.masked_fill_(~unpack_bitmask(bitmask, logits.shape[-1]), float("-inf"))
        logits.index_copy_(0, rows, sub)
    return logits


_FUSED_FAILED = False


def apply_packed_fused_(logits: torch.Tensor, bitmask: torch.Tensor) -> bool:
    """On CUDA: ``-inf`` where the packed int32 ``bitmask`` (same device, covering every logit
    column) has a 0 bit, in place, with xgrammar's fused Triton kernel (one pass over the
    logits, no unpacked [rows, vocab] temporaries). False if the kernel is unavailable, and
    the caller unpacks with torch ops instead."""
    global _FUSED_FAILED
    if _FUSED_FAILED or not logits.is_cuda or bitmask.shape[-1] * 32 < logits.shape[-1]:
        return False
    try:
        import xgrammar as xgr

        xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=logits.shape[-1],
                                        backend="triton")
        return True
    except Exception as e:  # noqa: BLE001 - no xgrammar/triton here: the torch path works
        _FUSED_FAILED = True
        logger.warning("fused bitmask kernel unavailable (%s); unpacking with torch", e)
        return False


def warm_up_fused(device: torch.device, logits_width: int, mask_words: int) -> None:
    """Compile the fused kernel's specializations now. Triton specializes integer arguments
    (the row count as 1, a multiple of 16, or another value): each is a JIT compile of ~100 ms
    on first use, which a serving process would otherwise pay inside its first constrained
    decode steps as batches shrink (measured: 3 ms per step over a 70-step 32-row run)."""
    if device.type != "cuda":
        return
    for rows in (1, 2, 16):
        logits = torch.zeros(rows, logits_width, device=device)
        mask = torch.full((rows, mask_words), -1, dtype=torch.int32, device=device)
        apply_packed_fused_(logits, mask)
