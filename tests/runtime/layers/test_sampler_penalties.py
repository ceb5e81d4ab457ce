"""Penalty tests: exact frequency/presence/repetition arithmetic, min_new_tokens masking of EOS and
stop_token_ids, incremental updates, and neutral rows when batches with and without merge."""
from __future__ import annotations

import torch

from sgdsl.runtime.layers.sampler import Sampler, SamplingBatchInfo
from sgdsl.runtime.sampling_params import SamplingParams as SP

V = 6


def test_no_penalty_builds_nothing() -> None:
    info = SamplingBatchInfo.from_params([SP(), SP(temperature=0.0)], V)
    assert info.penalties.is_empty


def test_frequency_and_presence_over_output_tokens() -> None:
    info = SamplingBatchInfo.from_params(
        [SP(frequency_penalty=0.5, presence_penalty=0.25)], V,
        prompt_ids=[[1, 1, 1]], output_ids=[[2, 2, 5]])
    logits = torch.zeros(1, V)
    out = info.penalties.apply(logits)
    assert out[0].tolist() == [0.0, 0.0, -1.25, 0.0, 0.0, -0.75]  # prompt tokens not counted
    info.update(torch.tensor([5]))
    assert info.penalties.apply(logits)[0, 5].item() == -1.25


def test_repetition_penalty_over_prompt_and_output() -> None:
    info = SamplingBatchInfo.from_params([SP(repetition_penalty=2.0)], V,
                                         prompt_ids=[[0]], output_ids=[[1]])
    logits = torch.tensor([[4.0, -4.0, 4.0, -4.0, 1.0, 1.0]])
    assert info.penalties.apply(logits)[0].tolist() == [2.0, -8.0, 4.0, -4.0, 1.0, 1.0]
    info.update(torch.tensor([2]))
    assert info.penalties.apply(logits)[0, 2].item() == 2.0


def test_greedy_with_repetition_penalty_avoids_repeat() -> None:
    info = SamplingBatchInfo.from_params([SP(temperature=0.0, repetition_penalty=1.9)], V,
                                         output_ids=[[0]])
    logits = torch.tensor([[3.0, 2.0, 0.0, 0.0, 0.0, 0.0]])
    assert int(Sampler().sample(logits, info)) == 1  # 3/1.9 < 2


def test_min_new_tokens_masks_eos_and_stop_ids_until_reached() -> None:
    params = [SP(temperature=0.0, min_new_tokens=2, stop_token_ids=(4,)),
              SP(temperature=0.0)]
    info = SamplingBatchInfo.from_params(params, V, eos_token_ids=[5])
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0, 9.0, 10.0]] * 2)
    sampler = Sampler()
    first = sampler.sample(logits, info)
    assert first.tolist() == [0, 5]  # row 0: both EOS and the stop id are masked
    info.update(first)
    assert sampler.sample(logits, info)[0] == 0
    info.update(first)
    assert sampler.sample(logits, info)[0] == 5  # two tokens generated: EOS allowed again


def test_min_new_tokens_counts_resumed_output() -> None:
    info = SamplingBatchInfo.from_params([SP(temperature=0.0, min_new_tokens=2)], V,
                                         eos_token_ids=[5], output_ids=[[1, 1]])
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, 10.0]])
    assert int(Sampler().sample(logits, info)) == 5


def test_merge_plain_batch_with_penalized_batch_uses_neutral_rows() -> None:
    plain = SamplingBatchInfo.from_params([SP(temperature=0.0)], V)
    pen = SamplingBatchInfo.from_params(
        [SP(temperature=0.0, frequency_penalty=1.0, repetition_penalty=1.5, min_new_tokens=2)],
        V, eos_token_ids=[5], prompt_ids=[[3]], output_ids=[[0]])
    plain.merge(pen)
    logits = torch.tensor([[1.0, 1.0, 1.0, 3.0, 1.0, 9.0]] * 2)
    out = plain.penalties.apply(logits)
    assert torch.equal(out[0], logits[0])  # the plain row is untouched
    # Repetition first (token 0 from the output, 3 from the prompt), then frequency (token 0).
    want = torch.tensor([1.0 / 1.5 - 1.0, 1.0, 1.0, 2.0, 1.0, float("-inf")])
    assert torch.allclose(out[1], want)
    plain.update(torch.tensor([2, 2]))
    out = plain.penalties.apply(logits)
    assert torch.equal(out[0], logits[0])
    assert abs(out[1, 2].item() - (1.0 / 1.5 - 1.0)) < 1e-6 and out[1, 5].item() == 9.0


def test_filter_drops_penalty_rows() -> None:
    info = SamplingBatchInfo.from_params(
        [SP(presence_penalty=1.0), SP(presence_penalty=2.0)], V, output_ids=[[1], [2]])
    info.filter([1])
    out = info.penalties.apply(torch.zeros(1, V))
    assert out[0].tolist() == [0.0, 0.0, -2.0, 0.0, 0.0, 0.0]
    assert info.batch_size == 1 and info.penalties.bs == 1
