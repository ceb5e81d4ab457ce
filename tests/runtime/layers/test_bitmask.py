"""apply_token_bitmask_ against a per-element reference."""
from __future__ import annotations

import pytest
import torch

from sgdsl.runtime.layers.bitmask import apply_token_bitmask_, unpack_bitmask


def _reference(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> torch.Tensor:
    out = logits.clone()
    for i, r in enumerate(rows):
        for t in range(logits.shape[1]):
            word = t // 32
            allowed = word < bitmask.shape[1] and (int(bitmask[i, word]) >> (t % 32)) & 1
            if not allowed:
                out[r, t] = float("-inf")
    return out


@pytest.mark.parametrize("vocab", [64, 100, 130])
def test_matches_reference(vocab):
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(3, vocab, generator=g)
    words = (vocab + 31) // 32
    bitmask = torch.randint(-2**31, 2**31 - 1, (3, words), generator=g, dtype=torch.int64).to(
        torch.int32)
    bitmask[1, 0] = -2**31  # only bit 31 of the first word
    got = apply_token_bitmask_(logits.clone(), bitmask)
    assert torch.equal(got, _reference(logits, bitmask, [0, 1, 2]))
    assert torch.isinf(got[1, :31]).all() and torch.isfinite(got[1, 31])


def test_rows_leave_other_rows_alone():
    logits = torch.randn(4, 70)
    bitmask = torch.zeros(2, 3, dtype=torch.int32)
    bitmask[0, 0] = 0b101
    bitmask[1, 2] = 1  # token 64
    got = apply_token_bitmask_(logits.clone(), bitmask, rows=torch.tensor([1, 3]))
    assert torch.equal(got[[0, 2]], logits[[0, 2]])
    assert torch.equal(got, _reference(logits, bitmask, [1, 3]))
    assert torch.isfinite(got[1]).sum() == 2 and torch.isfinite(got[3]).sum() == 1


def test_padded_vocab_masks_ids_past_the_bitmask():
    logits = torch.zeros(1, 40)
    bitmask = torch.full((1, 1), -1, dtype=torch.int32)  # covers 32 ids
    apply_token_bitmask_(logits, bitmask)
    assert torch.isfinite(logits[0, :32]).all() and torch.isinf(logits[0, 32:]).all()
    assert unpack_bitmask(bitmask, 40).shape == (1, 40)


def test_bad_shapes_raise():
    with pytest.raises(ValueError):
        apply_token_bitmask_(torch.zeros(2, 32), torch.zeros(1, 1, dtype=torch.int32))
    with pytest.raises(ValueError):
        apply_token_bitmask_(torch.zeros(1, 32), torch.zeros(1, 1, dtype=torch.int64))


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "bool"])
def test_sampler_mask_narrower_or_wider_than_logits(packed):
    """An lm_head padded past the tokenizer (logits wider than the mask) never samples the
    padding; a wider mask is cut. Both forms of the sampler's mask."""
    from sgdsl.runtime.layers.sampler import apply_vocab_mask

    logits = torch.randn(2, 70)
    allowed = torch.zeros(2, 64, dtype=torch.bool)
    allowed[0, [3, 63]] = True
    allowed[1, 5] = True
    mask = torch.zeros(2, 2, dtype=torch.int32) if packed else allowed
    if packed:
        mask[0, 0], mask[0, 1], mask[1, 0] = 1 << 3, -2**31, 1 << 5
    got = apply_vocab_mask(logits, mask)
    finite = torch.isfinite(got)
    assert finite[0].nonzero().flatten().tolist() == [3, 63]
    assert finite[1].nonzero().flatten().tolist() == [5]
    assert torch.equal(got[finite], logits[finite])
    wide = torch.cat([mask, mask], dim=-1)  # more words/columns than 70 logits need
    assert torch.equal(torch.isfinite(apply_vocab_mask(logits, wide))[:, :64], finite[:, :64])
