"""Sampled outputs under speculation have the target's distribution exactly.

A tiny random model with a 16-token vocabulary (a distribution with mass everywhere, so drafts
are accepted and rejected often); its prompt holds every token twice, followed once by the next
token and once by the previous one, so NGRAM always drafts, mostly a tree of two siblings.
Many unseeded requests at temperature 1: the histograms of the tokens a verify step emits
(the second and third output token: the first comes from the prefill; the draft after it is
one token and a sibling) match the
non-speculative engine's (two-sample chi-square). Seeded requests draw their noise per output
step, so speculative and plain outputs are even the same tokens."""
from __future__ import annotations

import json
import shutil

import pytest

VOCAB = 16
PROMPT = list(range(VOCAB)) + list(range(VOCAB - 1, -1, -1))
N = 600


@pytest.fixture(scope="module")
def tiny16(tmp_path_factory, tiny_model_dir):
    """tests/conftest.py's tiny Llama at a 16-token vocabulary (its tokenizer files kept).
    NOTE: not ``from conftest import ...``: in the whole suite that name is whichever
    conftest.py was imported first (tests/sgdsl/conftest.py, say)."""
    folder = tmp_path_factory.mktemp("tiny16")
    config = json.loads((tiny_model_dir / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, vocab_size=VOCAB)))
    for path in tiny_model_dir.iterdir():
        if path.is_file() and path.name != "config.json":
            shutil.copy(path, folder / path.name)
    return folder


@pytest.fixture(scope="module")
def engines(tiny16):
    from sgdsl.runtime import Engine

    common = dict(load_format="dummy", grammar_backend="none", num_threads=1, seed=3,
                  max_running_requests=N, max_total_tokens=N * 40)
    plain = Engine(str(tiny16), **common)
    spec = Engine(str(tiny16), speculative_algorithm="ngram", speculative_num_draft_tokens=2,
                  speculative_ngram_max_bfs_breadth=2, speculative_max_batch_size=N,
                  speculative_min_accept_per_step=0.0, speculative_min_speedup=0,
                  **common)
    yield plain, spec
    for engine in (plain, spec):
        engine.check_idle_integrity()
        engine.shutdown()


def _histograms(outs: list[dict]) -> list[list[int]]:
    hists = [[0] * VOCAB for _ in range(2)]
    for o in outs:
        for pos in range(2):
            hists[pos][o["output_ids"][pos + 1]] += 1
    return hists


def test_emitted_tokens_have_the_target_distribution(engines):
    from scipy.stats import chi2_contingency

    plain, spec = engines
    # 4 tokens: the first from the prefill, then a verify step with up to 2 draft nodes
    params = {"temperature": 1.0, "max_new_tokens": 4, "ignore_eos": True}
    want = _histograms(plain.generate(input_ids=[PROMPT] * N, sampling_params=params))
    got = _histograms(spec.generate(input_ids=[PROMPT] * N, sampling_params=params))
    stats = spec.stats()
    assert stats["spec_verify_rows"] >= N and stats["spec_accepted_tokens"] > 20
    assert stats["spec_tree_steps"] > 0
    assert stats["spec_accepted_tokens"] < stats["spec_draft_tokens"]  # rejections too
    for pos in range(2):
        cols = [i for i in range(VOCAB) if want[pos][i] + got[pos][i] > 0]
        table = [[want[pos][i] for i in cols], [got[pos][i] for i in cols]]
        assert chi2_contingency(table).pvalue > 1e-3, (pos, table)


def test_seeded_outputs_are_the_same_tokens(engines):
    plain, spec = engines
    params = [{"temperature": 1.0, "top_p": 0.9, "max_new_tokens": 8, "ignore_eos": True,
               "seed": s} for s in range(24)]
    want = plain.generate(input_ids=[PROMPT] * 24, sampling_params=params)
    got = spec.generate(input_ids=[PROMPT] * 24, sampling_params=params)
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
