"""A forced-completion measurement due on a row that jumps forward is made before the jump,
with or without the mask prefetch (overlap scheduling): the two paths decide alike.

Regression: the prefetch path measured after the jump, whose text ends in a lone space
(``"ok": `` -> ``'":'``, ``' '``) that the completion measured before it spells with the value
(``' false'``), so the need differed by a token and the overlapped engine forced ``false}``
where the synchronous one let the model sample (the embedded model on the person schema,
``"is_employed": false`` against the model's ``true``; benchmarks/RESULTS.md, spec-real (d))."""
from __future__ import annotations

import json

from sgdsl.runtime.grammar import GrammarKey
from sgdsl.runtime.grammar.forcing.budget import Budget
from sgdsl.runtime.grammar.manager import GrammarManager
from sgdsl.runtime.sampling_params import SamplingParams
from sgdsl.runtime.scheduler.finish import FinishChecker
from sgdsl.runtime.scheduler.req import Req

from ..helpers import EOS, VOCAB, feed_text, shared_compiler
from ..test_batch_step import SCHEMA

# the last key's value is all that is left once the jump-forward wrote `", "ok": `
TEXT, SAMPLED = '{"name": "x", "age": 12, "job": "teacher', '"'


def _step(backend, tokenizer, prefetched: bool, max_new: int) -> tuple:
    """One request whose sampled closing quote starts a jump-forward, due for a completion
    measurement: what one ``after_sample`` (and the deferred measurements) make of it."""
    manager = GrammarManager(backend, tokenizer, VOCAB, [EOS], jump_forward=True,
                             compiler=shared_compiler(backend))
    compiled = backend.compile(GrammarKey.from_constraint("json_schema", SCHEMA))
    req = Req("r0", [1, 2], SamplingParams(json_schema=json.dumps(SCHEMA),
                                           max_new_tokens=max_new))
    req.grammar = backend.new_grammar(compiled)
    assert feed_text(req.grammar, tokenizer, TEXT)
    req.output_ids = tokenizer.encode(TEXT, add_special_tokens=False) + [
        tokenizer.encode(SAMPLED, add_special_tokens=False)[-1]]
    req.completion = Budget()  # due now
    checker = FinishChecker([EOS], None)
    try:
        prefetch = manager.prefetch([req]) if prefetched else None
        assert (prefetch is not None) == prefetched
        manager.after_sample([req], checker, batch_size=1, prefetch=prefetch)
        manager.fill_bitmask([req], None, prefetch)
        manager.plan_deferred(checker)
    finally:
        manager.shutdown()
    return req.output_ids, req.finish_reason, req.forced_positions


def test_completion_due_at_a_jump_is_decided_alike_with_the_prefetch(backends, tokenizer):
    backend = backends["xgrammar"]
    for max_new in (29, 31):  # slack 1 before the jump (0 after it, measured wrongly)
        sync = _step(backend, tokenizer, prefetched=False, max_new=max_new)
        overlapped = _step(backend, tokenizer, prefetched=True, max_new=max_new)
        assert overlapped == sync, max_new
        ids, finish, _ = sync
        assert finish["type"] == "stop" and ids[-1] == EOS
        value = json.loads(tokenizer.decode(ids[:-1]))
        assert set(value) == set(SCHEMA["properties"])
