"""Native ``/generate`` (and ``/v1/completions``) with long text prompts (the router's workload): the prompt is encoded on
a worker thread (the server's EncodeBatcher), never on the event loop by the Engine's own
encoder, and the outputs are the Engine's for the same text, token for token (tiny random
model, greedy)."""
from __future__ import annotations

import asyncio
import random
from typing import Any, Iterator

import httpx
import pytest

from sgdsl.runtime.server.app import create_app
from sgdsl.runtime.server.context import OFFLOAD_ENCODE_CHARS
from sgdsl.runtime.server.thread_server import ThreadServer

WORDS = ["alpha", "beta", "gamma", "delta", "river", "stone", "city", "person", "blue", "seven"]
SP = {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True}


def text(seed: int, chars: int = OFFLOAD_ENCODE_CHARS + 100) -> str:
    rng = random.Random(seed)
    out = ""
    while len(out) < chars:
        out += rng.choice(WORDS) + " "
    return out.strip()


class Counted:
    """Counts a callable's calls (and the texts it got) and calls it."""

    def __init__(self, fn: Any) -> None:
        self.fn, self.calls = fn, []

    def __call__(self, arg: Any) -> Any:
        self.calls.append(arg)
        return self.fn(arg)


@pytest.fixture(scope="module")
def served(tiny_engine) -> Iterator[tuple[str, Any, Any]]:
    app = create_app(tiny_engine)
    server = ThreadServer(app)
    url = server.start()
    yield url, tiny_engine, app.state.ctx
    server.stop()


@pytest.fixture
def counted(served, monkeypatch) -> tuple[Counted, Counted]:
    """(the Engine's on-loop encoder, the server's worker-thread batch encoder)."""
    _, engine, ctx = served
    on_loop = Counted(engine._builder._encode)
    batched = Counted(ctx.batcher.encode_many)
    monkeypatch.setattr(engine._builder, "_encode", on_loop)
    monkeypatch.setattr(ctx.batcher, "encode_many", batched)
    return on_loop, batched


def post(url: str, bodies: list[dict]) -> list[dict]:
    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=300) as client:
            return await asyncio.gather(*(client.post("/generate", json=b) for b in bodies))
    resps = asyncio.run(go())
    assert all(r.status_code == 200 for r in resps), [r.text for r in resps]
    return [r.json() for r in resps]


def test_long_text_prompts_are_encoded_off_the_loop_with_the_engines_outputs(served, counted):
    url, engine, _ = served
    on_loop, batched = counted
    prompts = [text(i) for i in range(6)]
    outs = post(url, [{"text": p, "sampling_params": SP} for p in prompts])
    assert on_loop.calls == []  # the Engine got ids: nothing encoded on the event loop
    assert sorted(t for call in batched.calls for t in call) == sorted(prompts)
    on_loop.calls.clear()
    ref = engine.generate(prompt=prompts, sampling_params=SP)
    for out, want in zip(outs, ref):
        assert out["output_ids"] == want["output_ids"] and out["text"] == want["text"]
        assert out["meta_info"]["prompt_tokens"] == want["meta_info"]["prompt_tokens"]
    engine.check_idle_integrity()


def test_a_list_with_n_and_a_short_prompt_keeps_its_shape(served, counted):
    url, engine, _ = served
    on_loop, batched = counted
    prompts = [text(10), "a short prompt"]
    (out,) = post(url, [{"text": prompts, "sampling_params": {**SP, "n": 2}}])
    assert on_loop.calls == [] and len(batched.calls) == 1
    ref = engine.generate(prompt=prompts, sampling_params={**SP, "n": 2})
    assert [o["output_ids"] for o in out] == [r["output_ids"] for r in ref]
    assert len(out) == 4
    # a short prompt alone stays text (the Engine's encode on the loop is cheap for it)
    batched.calls.clear()
    on_loop.calls.clear()
    (short,) = post(url, [{"text": "a short prompt", "sampling_params": SP}])
    assert batched.calls == [] and on_loop.calls == ["a short prompt"]
    assert short["output_ids"] == ref[2]["output_ids"]
    engine.check_idle_integrity()


def test_a_long_prompt_over_the_context_still_gets_the_engines_error(served):
    url, _, _ = served
    body = {"text": text(20, chars=8 * OFFLOAD_ENCODE_CHARS), "sampling_params": SP}
    resp = httpx.post(url + "/generate", json=body, timeout=120)
    assert resp.status_code == 400 and "context length" in resp.text


def test_completions_with_a_long_prompt_and_echo(served, counted):
    url, engine, _ = served
    on_loop, batched = counted
    prompt = text(30)
    body = {"model": "default", "prompt": prompt, "max_tokens": 6, "temperature": 0.0,
            "echo": True, "logprobs": 1}
    resp = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    assert on_loop.calls == [] and batched.calls == [[prompt]]
    choice = resp.json()["choices"][0]
    ref = engine.generate(prompt=prompt, sampling_params={"max_new_tokens": 6,
                                                          "temperature": 0.0})
    assert choice["text"] == prompt + ref["text"]
    n_prompt = len(engine.tokenizer.encode(prompt, add_special_tokens=False))
    assert len(choice["logprobs"]["tokens"]) == n_prompt + ref["meta_info"]["completion_tokens"]
    engine.check_idle_integrity()
