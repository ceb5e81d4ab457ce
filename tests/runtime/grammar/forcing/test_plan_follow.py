"""plan_follow.rest_after: where a completion plan still applies after the model wrote other
values than the plan's, in the plan's structure."""
from __future__ import annotations

import pytest

from sgdsl.runtime.grammar.forcing.plan_follow import rest_after

PLAN = '", "age": 0, "city": "", "job": "engineer", "ok": false}'  # from inside a name


@pytest.mark.parametrize("new,rest", [
    ("ovelace", PLAN),  # the name only grew: the plan still closes it
    ('ace", "age": 36', ', "city": "", "job": "engineer", "ok": false}'),  # another number
    ('ace", "age": 36, "city": "Lon', '", "job": "engineer", "ok": false}'),  # value string
    ('ace", "age": 36, "ci', 'ty": "", "job": "engineer", "ok": false}'),  # a key: its rest
    ('ace", "age": 36, "city": "L", "job": "doctor", "ok": tr', 'ue}'),  # a literal begun
    ('ace", "age": 36, "city": "L", "job": "doctor", "ok": true', '}'),
    ('ace", "name', None),  # another key than the plan's
    ('ace", "age": "x', None),  # another kind of value
    ('ace", "age": 36}', None),  # closed where the plan goes on
    ('a\\"b", "age": 1', ', "city": "", "job": "engineer", "ok": false}'),  # an escaped quote
    ("", PLAN),  # nothing written since
])
def test_rest_after_from_inside_a_string(new, rest):
    assert rest_after(PLAN, new, in_string=True) == rest


def test_rest_after_outside_a_string():
    plan = '{"name": "", "tags": ["a"]}'
    assert rest_after(plan, '{"name": "Bob", "ta') == 'gs": ["a"]}'
    assert rest_after(plan, '{"name": "Bob", "tags": ["x", "y"') is None  # more items
    assert rest_after(plan, '{"name": "Bob", "tags": ["xy') == '"]}'
    assert rest_after("0, \"c\": 1}", "36") == ', "c": 1}'  # more digits of a number
    assert rest_after("abc.", "de") is None  # not JSON: no estimate from it


def test_tracker_knows_when_the_output_ends_inside_a_string(tokenizer):
    """The lexer state the structural estimate starts from, scanned incrementally (the tokens
    since the last measurement only), escapes included."""
    from types import SimpleNamespace

    from sgdsl.runtime.grammar.forcing.budget import Budget
    from sgdsl.runtime.grammar.forcing.completion import CompletionTracker

    from ..helpers import EOS, VOCAB

    tracker = CompletionTracker(tokenizer, VOCAB, [EOS])
    ids = tokenizer.encode('{"a": "x\\"y", "b": "z', add_special_tokens=False)
    req, budget = SimpleNamespace(output_ids=ids), Budget()
    cuts = list(range(1, len(ids) + 1))
    seen = [tracker._lex(req, budget, k) for k in cuts]  # one token more each time
    fresh = [CompletionTracker(tokenizer, VOCAB, [EOS])._lex(req, Budget(), k) for k in cuts]
    assert seen == fresh
    assert seen[-1] is True  # inside "z
    text_at = [tokenizer.decode(ids[:k]) for k in cuts]
    for text, inside in zip(text_at, seen):
        if text.endswith('", "b": "'):
            assert inside is True
        if text.endswith('y",'):
            assert inside is False
    # an older state is scanned again from the start: after {"a": the key is closed
    assert tracker._lex(req, budget, 3) is False and budget.lex[0] == 3
