"""The grammar disk cache through real engines (runtime/grammar/compile/disk_cache.py): an Engine
started again on the same cache folder compiles nothing and answers exactly as before;
``Engine.precompile`` and the server's ``POST /precompile`` warm the caches and report each
constraint's verdict."""
from __future__ import annotations

import json

import pytest

from sgdsl.runtime import Engine

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                           "age": {"type": "integer", "minimum": 0}},
          "required": ["name", "age"]}
CONSTRAINTS = [{"json_schema": SCHEMA}, {"regex": r"(yes|no)-[0-9]{3}"},
               {"ebnf": 'root ::= "ab" | "c" root'}]
INVALID = [{"regex": "(unclosed"}, {"json_schema": {"type": "nosuchtype"}},
           {"json_schema": SCHEMA, "regex": "a"}, {"temperature": 0.5}]


def _engine(model_dir, cache_dir) -> Engine:
    # NOTE: one compile worker (a process importing torch and xgrammar, seconds of CPU to
    # start): the restart's point is the disk, not the pool's width (CI time)
    return Engine(str(model_dir), load_format="dummy", max_total_tokens=2048,
                  max_running_requests=8, num_threads=1, grammar_cache_dir=str(cache_dir),
                  grammar_compile_workers=1)


def _outputs(engine: Engine) -> list[tuple[str, list[int]]]:
    params = [{**c, "max_new_tokens": 24, "temperature": 0.0} for c in CONSTRAINTS]
    outs = engine.generate(["Answer:"] * len(params), params)
    return [(o["text"], o["output_ids"]) for o in outs]


def test_restart_compiles_nothing(tiny_model_dir, tmp_path):
    first = _engine(tiny_model_dir, tmp_path)
    try:
        # warmed before Engine() returned (no first-request start-up): the worker compiled
        # its probe schema (compiler.WARM_PROBE) and nothing waits
        warm = first.stats()
        assert warm["grammar_compiles"] == 1 and warm["grammar_compile_seconds"]["count"] == 1
        assert warm["grammar_compile_running"] == 0 and warm["grammar_compile_queue_depth"] == 0
        results = first.precompile(CONSTRAINTS + INVALID)
        assert [r["ok"] for r in results] == [True] * 3 + [False] * 4
        assert results[3]["field"] == "regex" and results[3]["status"] == 400
        assert results[4]["field"] == "json_schema" and "nosuchtype" in results[4]["error"]
        assert "at most one" in results[5]["error"] and "exactly one" in results[6]["error"]
        stats = first.stats()
        compiled = stats["grammar_compiles"]
        assert compiled >= 3  # (and any warm-up compile of the engine's own)
        assert stats["grammar_disk_cache_misses"] >= compiled  # (and the invalid ones')
        outs = _outputs(first)  # precompiled: found in memory, nothing compiled again
        assert first.stats()["grammar_compiles"] == compiled
        first.check_idle_integrity()
    finally:
        first.shutdown()  # the compiles' files are written when it returns
    assert len(list(tmp_path.rglob("*.grammar"))) == compiled

    second = _engine(tiny_model_dir, tmp_path)
    try:
        assert second.stats()["grammar_disk_cache_hits"] == 1  # its warm probe, from disk
        assert _outputs(second) == outs
        stats = second.stats()
        assert stats["grammar_compiles"] == 0, stats
        assert stats["grammar_disk_cache_hits"] >= 3 and stats["grammar_disk_cache_errors"] == 0
        assert stats["grammar_disk_cache_misses"] == 0
        assert [r["ok"] for r in second.precompile(CONSTRAINTS)] == [True] * 3
        assert second.stats()["grammar_compiles"] == 0
        second.check_idle_integrity()
    finally:
        second.shutdown()


def test_precompile_argument_checked(engine):
    from sgdsl.runtime.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="list of objects"):
        engine.precompile({"regex": "a"})
    assert engine.precompile([]) == []
