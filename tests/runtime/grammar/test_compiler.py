"""GrammarCompiler: cache, failures, and the deadline, on a scripted backend."""
from __future__ import annotations

import threading

import pytest

from sgdsl.runtime.errors import InvalidRequestError
from sgdsl.runtime.grammar import GrammarBackend, GrammarCompiler, GrammarKey


class ScriptedBackend(GrammarBackend):
    """``slow`` blocks until released; ``bad`` is a compile error; ``boom`` a bug."""

    name = "scripted"

    def __init__(self) -> None:
        super().__init__(64, [0])
        self.release = threading.Event()
        self.calls: list[str] = []

    def compile(self, key: GrammarKey):
        self.calls.append(key.text)
        if key.text == "slow":
            self.release.wait(30)
        if key.text == "bad":
            raise InvalidRequestError("bad grammar", field=key.field)
        if key.text == "boom":
            raise KeyError("internal")
        return f"compiled:{key.text}"

    def new_grammar(self, compiled):
        return compiled


@pytest.fixture()
def scripted():
    backend = ScriptedBackend()
    yield backend
    backend.release.set()


def test_cache_hit_compiles_once(scripted):
    c = GrammarCompiler(scripted, timeout_s=10)
    assert c.compile(GrammarKey("regex", "a")) == "compiled:a"
    assert c.compile(GrammarKey("regex", "a")) == "compiled:a"
    assert scripted.calls == ["a"] and c.stats.hits == 1 and c.stats.misses == 1
    assert c.compile_seconds(GrammarKey("regex", "a")) is not None


def test_failures_are_typed_and_cached(scripted):
    c = GrammarCompiler(scripted, timeout_s=10)
    for _ in range(2):
        with pytest.raises(InvalidRequestError, match="bad grammar") as e:
            c.compile(GrammarKey("ebnf", "bad"))
        assert e.value.field == "ebnf"
    with pytest.raises(InvalidRequestError, match="failed to compile") as e:
        c.compile(GrammarKey("regex", "boom"))
    assert e.value.field == "regex"
    assert scripted.calls == ["bad", "boom"]


def test_deadline_fails_only_the_slow_request(scripted):
    # One worker: without replacing the pool the fast compile would queue behind the stuck one.
    c = GrammarCompiler(scripted, timeout_s=0.3, max_workers=1)
    slow = c.submit(GrammarKey("regex", "slow"))
    fast = c.submit(GrammarKey("regex", "fast"))
    with pytest.raises(InvalidRequestError, match="deadline") as e:
        slow.result(wait=True)
    assert e.value.field == "regex" and c.stats.timeouts == 1
    assert fast.result(wait=True) == "compiled:fast"
    with pytest.raises(InvalidRequestError, match="timed out before"):
        c.submit(GrammarKey("regex", "slow"))
    assert c.compile(GrammarKey("regex", "other")) == "compiled:other"


def test_pending_polls_without_blocking(scripted):
    c = GrammarCompiler(scripted, timeout_s=10)
    pending = c.submit(GrammarKey("regex", "slow"))
    assert not pending.ready()
    scripted.release.set()
    assert pending.result(wait=True) == "compiled:slow" and pending.ready()


def test_unsupported_kind_is_rejected_at_submit(scripted):
    scripted.supports = lambda kind: kind != "ebnf"
    with pytest.raises(InvalidRequestError, match="does not support ebnf"):
        GrammarCompiler(scripted).submit(GrammarKey("ebnf", "root ::= \"a\""))
