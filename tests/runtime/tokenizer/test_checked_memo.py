"""The request builder's remembered checks from several threads at once (the Engine builds in
its callers' threads and checks new schemas in its check pool's, runtime/tokenizer/
check_pool.py): no lookup races an eviction, and a schema being checked is checked once."""
from __future__ import annotations

import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from sgdsl.runtime.sampling_params import SamplingParams
from sgdsl.runtime.tokenizer import request_builder
from sgdsl.runtime.tokenizer.checked_memo import CheckedMemo
from sgdsl.runtime.tokenizer.request_builder import RequestBuilder

from .test_request_builder import READY, _build


@pytest.fixture
def fast_switches():
    """Threads switch every microsecond, so the interleavings a race needs are common."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def test_lookups_from_many_threads_meet_evictions(tokenizer, monkeypatch, fast_switches):
    """Four threads asking for 3 schemas' checks through a memo of 2: lookups keep meeting the
    others' evictions (an eviction between a thread's ``get`` and its ``move_to_end`` raises
    KeyError in an unlocked OrderedDict; CPython 3.11's GIL happens not to switch threads
    there, a free-threaded build would). The checks are stubbed (instant), so the memo's own
    operations are nearly all a thread does."""
    monkeypatch.setattr(request_builder, "CHECKED_MEMO_SIZE", 2)
    builder = RequestBuilder(tokenizer, READY)
    monkeypatch.setattr(builder, "_check_constraint", lambda sp, kind, text: (text, None))
    sps = [SamplingParams(json_schema=json.dumps({"type": "object", "title": f"s{i}"}),
                          max_new_tokens=8) for i in range(3)]

    def work(worker: int) -> int:
        for r in range(20_000):
            builder._checked_constraint(sps[(worker + r) % 3])
        return worker

    with ThreadPoolExecutor(4) as pool:
        assert sorted(pool.map(work, range(4))) == [0, 1, 2, 3]
    assert len(builder._checked) <= 2


def test_builds_from_many_threads_give_each_request_its_checked_schema(tokenizer):
    builder = RequestBuilder(tokenizer, READY)
    schemas = [json.dumps({"type": "object", "title": f"t{i}", "description": "x" * 5000,
                           "properties": {"a": {"type": "string", "maxLength": 10 ** 9}}})
               for i in range(4)]

    def work(worker: int) -> list[str]:
        return [_build(builder, {"json_schema": schemas[(worker + r) % 4],
                                 "max_new_tokens": 8})[0].json_schema for r in range(20)]

    with ThreadPoolExecutor(4) as pool:
        outs = [s for texts in pool.map(work, range(4)) for s in texts]
    # every build got its schema with the unreachable bound dropped, and each was checked once
    assert all("maxLength" not in s and json.loads(s)["title"].startswith("t") for s in outs)
    assert len(builder._checked) == 4


def test_a_schema_being_checked_in_one_thread_is_not_checked_again_in_another(tokenizer,
                                                                             monkeypatch):
    """The second thread waits for the first one's check (before: both ran it, so a burst
    sharing a new schema across threads paid it once per thread)."""
    from sgdsl.runtime.grammar.compile import limits

    real, gate, entered = limits._check_meta_schema, threading.Event(), []

    def gated(key, schema):
        entered.append(threading.current_thread().name)
        gate.wait(60)
        real(key, schema)
    monkeypatch.setattr(limits, "_check_meta_schema", gated)
    builder = RequestBuilder(tokenizer, READY)
    params = {"json_schema": json.dumps({"type": "object", "title": "shared"}),
              "max_new_tokens": 8}
    with ThreadPoolExecutor(2, thread_name_prefix="builder") as pool:
        first = pool.submit(_build, builder, params)
        _until(lambda: len(entered) == 1)
        second = pool.submit(_build, builder, params)
        # the second build is either in the check too (before) or waiting for the first's
        _until(lambda: len(entered) == 2 or _waiting_in_result(pool))
        gate.set()
        outs = [first.result(60)[0], second.result(60)[0]]
    assert len(entered) == 1 and outs[0].json_schema == outs[1].json_schema


def _until(condition, timeout_s: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.005)


def _waiting_in_result(pool: ThreadPoolExecutor) -> bool:
    """Whether one of ``pool``'s threads waits in a ``concurrent.futures.Future.result``."""
    frames = sys._current_frames()
    for thread in pool._threads:
        frame = frames.get(thread.ident)
        while frame is not None:
            if frame.f_code.co_name == "result" and "concurrent" in frame.f_code.co_filename:
                return True
            frame = frame.f_back
    return False


def test_a_key_being_computed_is_computed_once():
    memo = CheckedMemo(8)
    gate, calls = threading.Event(), []

    def compute() -> tuple:
        calls.append(1)
        gate.wait(30)
        return ("text", None)

    with ThreadPoolExecutor(5) as pool:
        first = pool.submit(memo.get, "k", compute)
        others = [pool.submit(memo.get, "k", compute) for _ in range(4)]
        gate.set()
        outcomes = [f.result(60) for f in [first, *others]]
    assert calls == [1] and all(o is outcomes[0] for o in outcomes)
    assert memo.known("k") and len(memo) == 1


def test_a_failed_computation_is_raised_to_its_waiters_and_not_remembered():
    memo = CheckedMemo(8)

    def boom() -> tuple:
        raise ValueError("broken")
    with pytest.raises(ValueError):
        memo.get("k", boom)
    assert not memo.known("k")
    assert memo.get("k", lambda: ("ok", None)) == ("ok", None)
