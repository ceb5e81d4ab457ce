"""The sampler on CUDA (run on the GPU machine): the same results as on the CPU where they are
deterministic (greedy, penalties, masks), valid distributions, and seeded rows independent of the
batch around them."""
from __future__ import annotations

import pytest
import torch

from sgdsl.runtime.layers.sampler import Sampler, SamplingBatchInfo, apply_vocab_mask
from sgdsl.runtime.sampling_params import SamplingParams as SP

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
V = 1000


def test_greedy_and_penalties_match_cpu() -> None:
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(0))
    params = [SP(temperature=0.0), SP(temperature=0.0, repetition_penalty=1.3),
              SP(temperature=0.0, frequency_penalty=0.7, presence_penalty=0.2),
              SP(temperature=0.0, min_new_tokens=3)]
    kw = dict(eos_token_ids=[int(logits[3].argmax())], prompt_ids=[[1, 2]] * 4,
              output_ids=[[int(logits[i].argmax())] for i in range(4)])
    outs = []
    for dev in ("cpu", "cuda"):
        info = SamplingBatchInfo.from_params(params, V, dev, **kw)
        outs.append(Sampler(device=dev).sample(logits.to(dev), info).cpu())
        info.update(outs[-1].to(dev))
    assert torch.equal(outs[0], outs[1])


def test_sampling_distribution_and_filters_on_cuda() -> None:
    from .test_sampler import reference_probs

    row = torch.linspace(3, -3, V) * 5
    n = 4000
    info = SamplingBatchInfo.from_params([SP(temperature=0.7, top_k=20, top_p=0.9, min_p=0.01)] * n,
                                         V, "cuda")
    out = Sampler(seed=0, device="cuda").sample(row.cuda().repeat(n, 1), info)
    assert out.device.type == "cuda"
    freq = (torch.bincount(out, minlength=V).double() / n).cpu()
    want = reference_probs(row, 0.7, 20, 0.9, 0.01)
    assert bool((freq[want == 0] == 0).all()) and int((want > 0).sum()) > 3
    assert (freq - want).abs().max() < 0.03


def test_seeded_rows_on_cuda_ignore_batch_composition() -> None:
    row = torch.randn(V, device="cuda")

    def run(bs: int, pos: int) -> int:
        logits = torch.randn(bs, V, device="cuda")
        logits[pos] = row
        params = [SP()] * bs
        params[pos] = SP(seed=7, top_p=0.95)
        info = SamplingBatchInfo.from_params(params, V, "cuda")
        return int(Sampler(seed=bs, device="cuda").sample(logits, info)[pos])

    assert len({run(1, 0), run(5, 3), run(8, 7)}) == 1


def test_packed_bitmask_on_cuda() -> None:
    allowed = torch.rand(3, V) < 0.1
    packed = torch.zeros(3, (V + 31) // 32, dtype=torch.int64)
    for r, c in allowed.nonzero().tolist():
        packed[r, c // 32] |= 1 << (c % 32)
    packed = packed.to(torch.int32)  # two's complement: bit 31 becomes the sign bit
    out = apply_vocab_mask(torch.zeros(3, V, device="cuda"), packed.cuda())
    assert torch.equal(torch.isfinite(out).cpu(), allowed)


def test_greedy_argmax_two_steps_on_cuda() -> None:
    from sgdsl.runtime.layers.sampler import greedy_argmax

    logits = torch.randn(3, 128256, generator=torch.Generator().manual_seed(3))
    logits[1, 5000] = logits[1, 100000] = 40.0  # a tie across chunks: the first index
    logits[2] = 0.5
    out = greedy_argmax(logits.cuda())
    assert out.dtype == torch.int64 and out.tolist() == logits.argmax(-1).tolist()
