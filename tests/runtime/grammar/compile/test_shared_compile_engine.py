"""Identical constraints share one compile through the Engine (issue 29 item 3): a burst of
requests naming the same schema, the same regex, runs one compile each, however the requests
interleave with it; the rest find the compile in flight or done (``compiler.py``: one cache
entry per key; that a request arriving mid-compile shares its future is
test_compiler.py::test_expected_wait_past_the_limit_is_refused_retryably)."""
from __future__ import annotations

import asyncio
import json
import uuid

import jsonschema

COPIES = 6


def test_identical_constraints_in_a_burst_compile_once(engine):
    # NOTE: a title no other test sends, so the session's tiny engine has not compiled it
    schema = {"title": f"shared-{uuid.uuid4().hex}", "type": "object", "required": ["n"],
              "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}}}
    tag = uuid.uuid4().hex[:6]
    text, regex = json.dumps(schema), f"(yes|no)-{tag}"
    params = [{"json_schema": text, "max_new_tokens": 12, "temperature": 1.0}] * COPIES + \
        [{"regex": regex, "max_new_tokens": 12}] * COPIES
    before = engine.stats()

    async def burst():
        return await asyncio.gather(*(engine.async_generate("Hi", p) for p in params))
    outs = asyncio.run(burst())
    after = engine.stats()
    assert after["grammar_compiles"] - before["grammar_compiles"] == 2, (before, after)
    assert after["grammar_compile_cache_misses"] - before["grammar_compile_cache_misses"] == 2
    assert after["grammar_compile_cache_hits"] - before["grammar_compile_cache_hits"] \
        == 2 * (COPIES - 1)
    for out in outs[:COPIES]:  # every copy got the grammar (forced completion ends them)
        if out["meta_info"]["finish_reason"]["type"] == "stop":
            jsonschema.validate(json.loads(out["text"]), schema)
    for out in outs[COPIES:]:  # within the regex (a prefix of a match when cut short)
        assert any(f"{w}-{tag}".startswith(out["text"]) for w in ("yes", "no")), out["text"]
