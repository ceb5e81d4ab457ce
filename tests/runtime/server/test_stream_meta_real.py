"""Streamed ``meta_info`` as SGLang streams it, against the real server with the embedded model:
each chunk carries only its own output logprobs, with ``output_token_logprobs_length``, and the
chunks' entries put together are the non-streamed result's. Ports SGLang's
``test_stream_logprobs`` (python/sglang/test/test_programs.py) twice: on the wire, read as
SGLang's ``RuntimeEndpoint.generate_stream`` reads it, and verbatim as a program of this
language (``import sgdsl as sgl``) through our ``RuntimeEndpoint``; and the OpenAI routes'
streamed logprobs (official client) against their plain ones."""
from __future__ import annotations

import asyncio
import json

import openai
import pytest

import sgdsl as sgl
from sgdsl.backends.runtime_endpoint import RuntimeEndpoint

from .conftest import API_KEY, Served

PROMPT = "Compose an engaging travel blog post about a recent trip to Hawaii."
BODY = {"text": PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": 24},
        "return_logprob": True, "top_logprobs_num": 2, "return_text_in_logprobs": True}


def _sse(resp_text: str) -> list[dict]:
    events = [line[6:] for line in resp_text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def _close(a: list, b: list) -> bool:
    """Same tokens (and texts), logprobs equal to float noise."""
    return len(a) == len(b) and all(x[1:] == y[1:] and x[0] == pytest.approx(y[0], abs=1e-4)
                                    for x, y in zip(a, b))


def test_stream_logprobs_on_the_wire(real_server: Served) -> None:
    """SGLang's assertions, per chunk as its client yields them (text past what it has)."""
    with real_server.client() as client:
        chunks = _sse(client.post("/generate", json=BODY | {"stream": True}).text)
    assert len(chunks) > 1
    pos, prev = 0, 0
    for data in chunks:
        chunk_text, meta = data["text"][pos:], data["meta_info"]
        pos += len(chunk_text)
        assert chunk_text or meta["finish_reason"] is not None  # no chunk without news
        for key in ("id", "finish_reason", "prompt_tokens", "completion_tokens",
                    "cached_tokens", "output_token_logprobs", "output_token_logprobs_length"):
            assert key in meta, key
        tokens, length = meta["completion_tokens"], meta["output_token_logprobs_length"]
        assert tokens == length == len(data["output_ids"])
        assert len(meta["output_token_logprobs"]) == tokens - prev
        assert len(meta["output_top_logprobs"]) == tokens - prev
        assert [e[1] for e in meta["output_token_logprobs"]] == data["output_ids"][prev:]
        prev = tokens
    assert chunks[-1]["meta_info"]["e2e_latency"] > 0
    assert "e2e_latency" not in chunks[0]["meta_info"]


def test_stream_chunks_add_up_to_the_plain_result(real_server: Served) -> None:
    with real_server.client() as client:
        plain = client.post("/generate", json=BODY).json()
        chunks = _sse(client.post("/generate", json=BODY | {"stream": True}).text)
    meta = plain["meta_info"]
    assert meta["output_token_logprobs_length"] == len(meta["output_token_logprobs"])
    assert meta["e2e_latency"] > 0
    joined = [e for c in chunks for e in c["meta_info"]["output_token_logprobs"]]
    tops = [t for c in chunks for t in c["meta_info"]["output_top_logprobs"]]
    assert _close(joined, meta["output_token_logprobs"])
    assert [[e[1:] for e in t] for t in tops] == [
        [e[1:] for e in t] for t in meta["output_top_logprobs"]]
    # the prompt's entries are whole in every chunk, as SGLang sends them
    assert all(c["meta_info"]["input_token_logprobs"] == meta["input_token_logprobs"]
               for c in chunks)
    assert chunks[-1]["text"] == plain["text"] and chunks[-1]["output_ids"] == plain["output_ids"]


@sgl.function
def qa(s, question):
    s += sgl.system("You are a helpful assistant.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", return_logprob=True))


def test_sglang_test_stream_logprobs_program(real_server: Served) -> None:
    """SGLang's ``test_stream_logprobs`` as it is written (max_new_tokens 64 there), then the
    final meta_info against a non-streamed run's."""
    backend = RuntimeEndpoint(real_server.url, api_key=API_KEY)

    async def collect_chunks():
        ret = qa.run(question=PROMPT, stream=True, temperature=0, max_new_tokens=32,
                     backend=backend)
        chunks = []
        async for chunk_text, meta_info in ret.text_async_iter("answer", return_meta_data=True):
            chunks.append((chunk_text, meta_info))
        return chunks, ret

    chunks, state = asyncio.run(collect_chunks())
    assert len(chunks) > 1
    prev_completion_tokens = 0
    prev_output_token_logprobs_length = 0
    for chunk_text, meta_info in chunks:
        assert chunk_text
        assert "output_token_logprobs" in meta_info
        assert "output_token_logprobs_length" in meta_info
        completion_tokens = meta_info["completion_tokens"]
        output_token_logprobs_length = meta_info["output_token_logprobs_length"]
        chunk_output_token_logprobs = meta_info["output_token_logprobs"]
        assert completion_tokens == output_token_logprobs_length
        assert len(chunk_output_token_logprobs) == completion_tokens - prev_completion_tokens
        assert len(chunk_output_token_logprobs) == (
            output_token_logprobs_length - prev_output_token_logprobs_length)
        prev_completion_tokens = completion_tokens
        prev_output_token_logprobs_length = output_token_logprobs_length
    plain = qa.run(question=PROMPT, temperature=0, max_new_tokens=32, backend=backend)
    streamed, whole = state.get_meta_info("answer"), plain.get_meta_info("answer")
    assert state["answer"] == plain["answer"]
    assert streamed["completion_tokens"] == whole["completion_tokens"]
    assert _close(streamed["output_token_logprobs"], whole["output_token_logprobs"])
    assert streamed["output_token_logprobs_length"] == whole["completion_tokens"]


@pytest.mark.parametrize("chat", [True, False])
def test_openai_stream_logprobs_equal_plain(real_server: Served, chat: bool) -> None:
    client = openai.OpenAI(base_url=real_server.url + "/v1", api_key=API_KEY, max_retries=0)
    args = dict(model=real_server.model, max_tokens=12, temperature=0)
    if chat:
        args |= dict(messages=[{"role": "user", "content": PROMPT}], logprobs=True,
                     top_logprobs=2)
        plain = client.chat.completions.create(**args).choices[0].logprobs.content
        parts = [c.choices[0].logprobs.content for c in
                 client.chat.completions.create(**args, stream=True)
                 if c.choices and c.choices[0].logprobs]
        joined = [t for p in parts for t in p]
        assert [t.token for t in joined] == [t.token for t in plain]
        assert [t.logprob for t in joined] == pytest.approx([t.logprob for t in plain], abs=1e-4)
        assert [len(t.top_logprobs) for t in joined] == [2] * len(plain)
    else:
        args |= dict(prompt=PROMPT, logprobs=2)
        plain = client.completions.create(**args).choices[0].logprobs
        parts = [c.choices[0].logprobs for c in client.completions.create(**args, stream=True)
                 if c.choices and c.choices[0].logprobs]
        assert [t for p in parts for t in p.tokens] == plain.tokens
        assert [o for p in parts for o in p.text_offset] == plain.text_offset
        assert [v for p in parts for v in p.token_logprobs] == pytest.approx(
            plain.token_logprobs, abs=1e-4)
