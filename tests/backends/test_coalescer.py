"""Coalescing in both runtime backends: concurrent single generates reach the engine (Local) or
the server (RuntimeEndpoint) as one list request; each caller gets its own result, error or
cancellation."""
from __future__ import annotations

import asyncio

import pytest

from sgdsl.backends.base import BackendError, Context
from sgdsl.backends.local import Local
from sgdsl.ir import SamplingParams
from sgdsl.runtime.errors import InvalidRequestError
from srt_fakes import FakeEngine, FakeRuntime, make_endpoint


class StrictRuntime(FakeRuntime):
    """Rejects a whole call if any prompt asks for top_p == 0 (as the real engine validates)."""

    def generate(self, req):
        sps = req.get("sampling_params")
        if any(sp.get("top_p") == 0.0 for sp in (sps if isinstance(sps, list) else [sps])):
            self.requests.append(req)
            raise InvalidRequestError("top_p must be in (0.0, 1.0]", field="top_p")
        return super().generate(req)


def backend_of(kind: str, runtime: FakeRuntime):
    return Local(engine=FakeEngine(runtime)) if kind == "Local" else make_endpoint(runtime)


KINDS = pytest.mark.parametrize("kind", ["Local", "RuntimeEndpoint"])


@KINDS
async def test_concurrent_generates_become_one_call(kind):
    runtime = FakeRuntime()
    backend = backend_of(kind, runtime)
    results = await asyncio.gather(*(
        backend.generate(Context(text=f"q{i}"), SamplingParams(max_tokens=i + 1)) for i in range(5)))
    assert [r[0].text for r in results] == ["x", "xy", "xyx", "xyxy", "xyxyx"]
    assert len(runtime.requests) == 1
    req = runtime.requests[0]
    assert req["text"] == [f"q{i}" for i in range(5)] and len(set(req["rid"])) == 5
    assert [sp["max_new_tokens"] for sp in req["sampling_params"]] == [1, 2, 3, 4, 5]


@KINDS
async def test_a_bad_request_fails_alone(kind):
    runtime = StrictRuntime()
    backend = backend_of(kind, runtime)
    good, bad = await asyncio.gather(
        backend.generate(Context(text="a"), SamplingParams(max_tokens=2)),
        backend.generate(Context(text="b"), SamplingParams(top_p=0.0)), return_exceptions=True)
    assert good[0].text == "xy"
    assert isinstance(bad, BackendError) and bad.status == 400
    # the list request, then each prompt alone: only the bad one fails
    assert [r["text"] for r in runtime.requests] == [["a", "b"], "a", "b"]


@KINDS
async def test_different_logprob_options_are_separate_calls_and_cancel_is_not_sent(kind):
    runtime = FakeRuntime()
    backend = backend_of(kind, runtime)
    doomed = asyncio.create_task(backend.generate(Context(text="z"), SamplingParams()))
    await asyncio.sleep(0)
    doomed.cancel()
    await asyncio.gather(
        backend.generate(Context(text="a"), SamplingParams(max_tokens=1)),
        backend.generate(Context(text="b"), SamplingParams(max_tokens=1, return_logprob=True)))
    with pytest.raises(asyncio.CancelledError):
        await doomed
    sent = [r["text"] for r in runtime.requests]
    assert sorted(sent) == ["a", "b"]  # two option groups, the cancelled one never sent


class FailingRuntime(FakeRuntime):
    """A list call reports the prompt "bad" failed in its own output, as the runtime does."""

    def generate(self, req):
        outs = super().generate(req)
        for out, text in zip(outs if isinstance(outs, list) else [outs],
                             req["text"] if isinstance(req["text"], list) else [req["text"]]):
            if text == "bad":
                out["meta_info"]["finish_reason"] = {
                    "type": "abort", "message": "regex did not compile", "status_code": 400,
                    "err_type": "invalid_request_error"}
        return outs


@KINDS
async def test_a_request_failed_in_a_list_answer_fails_alone_without_a_retry(kind):
    runtime = FailingRuntime()
    backend = backend_of(kind, runtime)
    good, bad = await asyncio.gather(
        backend.generate(Context(text="a"), SamplingParams(max_tokens=2)),
        backend.generate(Context(text="bad"), SamplingParams(max_tokens=2)),
        return_exceptions=True)
    assert good[0].text == "xy"
    assert isinstance(bad, BackendError) and bad.status == 400 and "compile" in str(bad)
    assert len(runtime.requests) == 1
