"""The mixed workload the TP, PP and EP engine tests run on a TP=1 engine and on a parallel one
(``run_mixed``), and what the parallel engine's answers must equal (``assert_same``): greedy
tokens over a mixed batch, chunked prefill (16-token budget), a KV pool small enough to force
retraction, cache hits with logprobs on the second pass, grammar and seeded sampling."""
from __future__ import annotations

from sgdsl.runtime import Engine
from greedy import MIXED_PROMPTS

PROMPTS = MIXED_PROMPTS
MAX_NEW = 12
GREEDY = {"temperature": 0, "max_new_tokens": MAX_NEW}
# chunked prefill on (16-token budget) and a pool small enough to force retraction; one
# compile worker per rank (the workload compiles two grammars; each worker is a process that
# imports torch: seconds of CPU per rank on the 2-core CI box)
SMALL = dict(chunked_prefill_size=16, max_total_tokens=72, num_threads=1,
             grammar_compile_workers=1)
# For engines whose test sends no grammar: no compile or estimate workers at all.
NO_GRAMMAR = dict(SMALL, grammar_backend="none")
TINY = dict(load_format="dummy", **SMALL)


def run_mixed(engine: Engine, extra: bool = True) -> dict:
    """Two passes (the second hits the cache, with logprobs); returns what TP must equal."""
    stats0 = engine.stats()
    first = engine.generate(PROMPTS, GREEDY)
    second = engine.generate(PROMPTS, GREEDY, return_logprob=True, top_logprobs_num=3)
    # grammar (compiled on every rank, rank 0 decides when) and seeded sampling
    extra = [] if not extra else engine.generate(PROMPTS[:3], [
        {"temperature": 0, "max_new_tokens": MAX_NEW, "regex": "(yes|no)[0-9]{2,5}!"},
        {"temperature": 0.9, "seed": 7, "max_new_tokens": MAX_NEW},
        {"temperature": 0, "max_new_tokens": MAX_NEW,
         "json_schema": '{"type": "object", "properties": {"a": {"type": "integer"}}}'}])
    stats = engine.stats()
    engine.check_idle_integrity()  # at TP > 1: every rank's pools
    return {"extra": [r["text"] for r in extra],"first": [r["output_ids"] for r in first],
            "second": [r["output_ids"] for r in second],
            "cached": sum(r["meta_info"]["cached_tokens"] for r in second),
            "logprobs": [r["meta_info"]["output_token_logprobs"] for r in second],
            "top": [r["meta_info"]["output_top_logprobs"] for r in second],
            "retractions": stats["retractions_total"] - stats0["retractions_total"]}


def assert_same(tp: dict, ref: dict) -> None:
    assert tp["first"] == ref["first"] and tp["second"] == ref["second"]
    assert tp["first"] == tp["second"]
    assert tp["extra"] == ref["extra"]
    assert tp["retractions"] > 0 and tp["cached"] > 0  # the paths under test did run
    for got, want in zip(tp["logprobs"], ref["logprobs"]):
        assert [t[1] for t in got] == [t[1] for t in want]
        assert max(abs(g[0] - w[0]) for g, w in zip(got, want)) < 1e-4
    for got, want in zip(tp["top"], ref["top"]):
        for g_row, w_row in zip(got, want):
            assert [t[1] for t in g_row] == [t[1] for t in w_row]
            assert max(abs(g[0] - w[0]) for g, w in zip(g_row, w_row)) < 1e-4
