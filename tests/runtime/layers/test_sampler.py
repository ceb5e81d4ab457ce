"""Sampler tests: greedy fast path, temperature/top-k/top-p/min-p distributions, seeds that are
independent of batch composition (retract-and-resume reproduces), vocab masks, filter/merge."""
from __future__ import annotations

import torch

from sgdsl.runtime.layers.sampler import (Sampler, SamplingBatchInfo, apply_vocab_mask,
                                          argmax_chunks, mix_seed, two_step_argmax)
from sgdsl.runtime.sampling_params import SamplingParams as SP

V = 8


def info_for(params: list[SP], **kw) -> SamplingBatchInfo:
    return SamplingBatchInfo.from_params(params, V, "cpu", **kw)


def test_greedy_fast_path_is_argmax_and_leaves_logits_untouched() -> None:
    logits = torch.randn(5, V, generator=torch.Generator().manual_seed(0))
    before = logits.clone()
    info = info_for([SP(temperature=0.0)] * 4 + [SP(top_k=1)])
    assert info.all_greedy
    out = Sampler().sample(logits, info)
    assert out.tolist() == logits.argmax(-1).tolist()
    assert torch.equal(logits, before)


def empirical(params: SP, logits_row: torch.Tensor, n: int = 4000) -> torch.Tensor:
    logits = logits_row.repeat(n, 1)
    out = Sampler(seed=1).sample(logits, info_for([params] * n))
    return torch.bincount(out, minlength=V).float() / n


LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])


def test_temperature_sampling_follows_softmax() -> None:
    for temp in (0.5, 1.0, 2.0):
        freq = empirical(SP(temperature=temp), LOGITS)
        want = torch.softmax(LOGITS / temp, -1)
        assert (freq - want).abs().max() < 0.03, (temp, freq, want)


def test_top_k_keeps_only_k_most_likely_renormalized() -> None:
    freq = empirical(SP(temperature=1.0, top_k=3), LOGITS)
    assert freq[3:].sum() == 0
    want = torch.softmax(LOGITS[:3], -1)
    assert (freq[:3] - want).abs().max() < 0.03


def test_top_p_nucleus() -> None:
    probs = torch.softmax(LOGITS, -1)  # cumulative: .40 .65 .80 .89 ...
    freq = empirical(SP(top_p=0.7), LOGITS)
    assert freq[3:].sum() == 0 and freq[2] > 0  # tokens 0..2 reach 0.6
    want = probs[:3] / probs[:3].sum()
    assert (freq[:3] - want).abs().max() < 0.03


def reference_probs(logits: torch.Tensor, temp: float, top_k: int, top_p: float,
                    min_p: float) -> torch.Tensor:
    """HF-style warpers in sequence, each renormalizing, in float64 (the test's oracle)."""
    p = torch.softmax(logits.double() / temp, -1)
    order = p.argsort(descending=True)
    keep = torch.zeros_like(p, dtype=torch.bool)
    keep[order[:top_k]] = True
    p = torch.where(keep, p, 0.0) / p[keep].sum()
    total = 0.0
    for i in order.tolist():
        if total > top_p:
            p[i] = 0.0
        total += float(p[i])
    p = p / p.sum()
    p = torch.where(p >= min_p * p.max(), p, 0.0)
    return p / p.sum()


def test_top_k_then_top_p_renormalizes_between() -> None:
    # top-3 renormalized is .51 .31 .19: a 0.7 nucleus holds two tokens (over the full
    # distribution it would hold three).
    freq = empirical(SP(top_k=3, top_p=0.7), LOGITS)
    assert freq[2:].sum() == 0
    want = reference_probs(LOGITS, 1.0, 3, 0.7, 0.0)
    assert (freq.double() - want).abs().max() < 0.03


def test_all_filters_together_match_reference() -> None:
    logits = torch.linspace(2, -2, V) + torch.tensor([0.3, -0.2, 0.1, 0.0, 0.2, -0.1, 0.0, 0.1])
    want = reference_probs(logits, 0.8, 6, 0.9, 0.15)
    freq = empirical(SP(temperature=0.8, top_k=6, top_p=0.9, min_p=0.15), logits)
    assert torch.equal(freq > 0, want > 0)
    assert (freq.double() - want).abs().max() < 0.03


def test_min_p_floor() -> None:
    probs = torch.softmax(LOGITS, -1)
    freq = empirical(SP(min_p=0.3), LOGITS)
    keep = probs >= 0.3 * probs.max()
    assert freq[~keep].sum() == 0 and bool((freq[keep] > 0).all())


def test_mixed_batch_greedy_rows_exact() -> None:
    logits = torch.randn(6, V, generator=torch.Generator().manual_seed(3))
    params = [SP(temperature=0.0), SP(temperature=1.5, top_p=0.9), SP(temperature=0.0),
              SP(top_k=2, temperature=1.0), SP(temperature=0.0), SP(min_p=0.1)]
    out = Sampler().sample(logits, info_for(params))
    for row in (0, 2, 4):
        assert out[row] == logits[row].argmax()
    top2 = logits[3].topk(2).indices.tolist()
    assert int(out[3]) in top2


def test_seeded_row_depends_only_on_seed_step_and_logits() -> None:
    torch.manual_seed(0)
    row = torch.randn(V * 8)
    big_v = row.numel()

    def run(batch_rows: int, position: int, sampler_seed: int, step: int) -> int:
        logits = torch.randn(batch_rows, big_v)
        logits[position] = row
        params = [SP(temperature=1.0)] * batch_rows
        params[position] = SP(temperature=1.0, seed=1234)
        outputs = [[0] * step if i == position else [] for i in range(batch_rows)]
        info = SamplingBatchInfo.from_params(params, big_v, output_ids=outputs)
        return int(Sampler(seed=sampler_seed).sample(logits, info)[position])

    first = run(1, 0, 0, step=5)
    assert all(run(bs, pos, s, step=5) == first for bs, pos, s in [(3, 2, 7), (4, 1, 9), (2, 0, 3)])
    # Different steps draw different noise: over several steps the tokens are not all equal.
    assert len({run(1, 0, 0, step=t) for t in range(8)}) > 1


def test_resumed_seeded_request_reproduces_sequence() -> None:
    torch.manual_seed(1)
    table = torch.randn(6, 32)  # logits at each step (stand-in for a model)
    params = SP(temperature=0.8, top_p=0.95, seed=42)

    def generate(steps: range, info: SamplingBatchInfo) -> list[int]:
        out = []
        for t in steps:
            tok = Sampler(seed=t).sample(table[t:t + 1], info)
            info.update(tok)
            out.append(int(tok))
        return out

    full = generate(range(6), SamplingBatchInfo.from_params([params], 32))
    head = full[:3]  # retracted after 3 tokens, resumed with its output so far
    resumed = SamplingBatchInfo.from_params([params], 32, output_ids=[head])
    assert head + generate(range(3, 6), resumed) == full


def test_mix_seed_spreads() -> None:
    values = {mix_seed(s, t) for s in range(10) for t in range(10)}
    assert len(values) == 100 and all(0 <= v < 2**63 for v in values)


def test_vocab_mask_bool_and_packed_bitmask() -> None:
    logits = torch.zeros(2, 40)
    allowed = torch.zeros(2, 40, dtype=torch.bool)
    allowed[0, [3, 35]] = True
    allowed[1, [0, 31, 39]] = True
    out_bool = apply_vocab_mask(logits, allowed)
    packed = torch.zeros(2, 2, dtype=torch.int32)
    for r, c in allowed.nonzero().tolist():
        packed[r, c // 32] |= torch.tensor(1 << (c % 32)).to(torch.int32)
    out_packed = apply_vocab_mask(logits, packed)
    assert torch.equal(torch.isfinite(out_bool), allowed)
    assert torch.equal(torch.isfinite(out_packed), allowed)


def test_vocab_mask_matches_xgrammar_bitmask_layout() -> None:
    import xgrammar as xgr

    bitmask = xgr.allocate_token_bitmask(1, 40)
    bitmask.fill_(0)
    bitmask[0, 0] = 1 << 5
    bitmask[0, 1] = 1 << 2  # token 34
    ref = torch.zeros(1, 40)
    xgr.apply_token_bitmask_inplace(ref, bitmask)
    ours = apply_vocab_mask(torch.zeros(1, 40), bitmask)
    assert torch.equal(torch.isfinite(ref), torch.isfinite(ours))
    assert torch.isfinite(ours).nonzero()[:, 1].tolist() == [5, 34]


def test_sampler_honours_vocab_mask() -> None:
    logits = torch.tensor([[5.0, 0.0, 0.0, 1.0]] * 2)
    mask = torch.tensor([[False, True, False, True]] * 2)
    info = SamplingBatchInfo.from_params([SP(temperature=0.0), SP(temperature=1.0)], 4)
    out = Sampler().sample(logits, info, vocab_mask=mask)
    assert out[0] == 3 and int(out[1]) in (1, 3)


def test_filter_and_merge_keep_rows_aligned() -> None:
    a = info_for([SP(temperature=0.5, seed=1), SP(temperature=0.0), SP(top_k=3, seed=3)])
    b = info_for([SP(top_p=0.5, frequency_penalty=1.0)], output_ids=[[2, 2]])
    a.update(torch.tensor([1, 2, 3]))
    a.filter([2, 0])
    a.merge(b)
    ref = info_for([SP(top_k=3, seed=3), SP(temperature=0.5, seed=1),
                    SP(top_p=0.5, frequency_penalty=1.0)], output_ids=[[3], [1], [2, 2]])
    for name in ("temperatures", "top_ps", "top_ks", "min_ps", "is_greedy"):
        assert torch.equal(getattr(a, name), getattr(ref, name)), name
    assert a.seeds == ref.seeds and a.steps == ref.steps == [1, 1, 2]
    logits = torch.randn(3, V)
    assert torch.equal(a.penalties.apply(logits), ref.penalties.apply(logits))


def test_two_step_argmax_is_argmax_with_first_index_ties() -> None:
    assert argmax_chunks(128256) == 256 and argmax_chunks(151936) == 128
    assert argmax_chunks(32001) is None and argmax_chunks(1000) is None
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 128256, generator=gen)
    logits[1, 7000] = logits[1, 90000] = 50.0  # ties in two chunks: the first wins
    logits[2, 501 * 3 + 4] = logits[2, 501 * 3 + 9] = 50.0  # a tie inside a chunk
    logits[3] = 1.0  # all equal: index 0
    logits[4, 128255] = 60.0  # the last index
    out = two_step_argmax(logits, 256)
    assert out.tolist() == logits.argmax(dim=-1).tolist() == [out[0].item(), 7000, 1507, 0, 128255]
