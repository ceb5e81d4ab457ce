"""Anthropic backend request shapes and response handling, through the official client
against an httpx MockTransport."""
from __future__ import annotations

import json

import httpx2  # this anthropic release is built on httpx2 and rejects httpx clients
import pytest

from sgdsl.backends.anthropic import Anthropic
from sgdsl.backends.base import BackendError, Context, ImageData, Message, UnsupportedError
from sgdsl.choices import token_length_normalized
from sgdsl.ir import Constraint, SamplingParams

from test_openai_backend import Server


def AServer(*replies) -> Server:
    return Server(*replies, http=httpx2)


def reply(content: list[dict], stop: str = "end_turn", seq: str | None = None) -> dict:
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude",
            "content": content, "stop_reason": stop, "stop_sequence": seq,
            "usage": {"input_tokens": 9, "output_tokens": 3, "cache_read_input_tokens": 4}}


def text(t: str) -> dict:
    return {"type": "text", "text": t}


def tool(value: dict) -> dict:
    return {"type": "tool_use", "id": "tu_1", "name": "answer", "input": value}


def backend(server: Server, **kw) -> Anthropic:
    client = httpx2.AsyncClient(transport=httpx2.MockTransport(server))
    return Anthropic("claude", base_url="http://127.0.0.1:1", api_key="k", http_client=client,
                     max_retries=0, **kw)


CTX = Context(text="", messages=(Message("system", "Be brief."), Message("user", "Hi"),
                                 Message("user", " there"), Message("assistant", "Sure, ")),
              open_role="assistant")


async def test_request_shape_and_meta():
    server = AServer(reply([text("done")], stop="stop_sequence", seq="\n"))
    [result] = await backend(server).generate(
        CTX, SamplingParams(max_tokens=5, temperature=0.2, top_k=4, stop=("\n",)))
    body = server.bodies[0]
    assert body["system"] == "Be brief."
    assert body["messages"] == [{"role": "user", "content": "Hi there"},
                                {"role": "assistant", "content": "Sure,"}]  # prefill, rstripped
    assert (body["max_tokens"], body["temperature"], body["top_k"]) == (5, 0.2, 4)
    assert body["stop_sequences"] == ["\n"]
    assert result.text == "done"
    assert result.meta_info["prompt_tokens"] == 9 and result.meta_info["cached_tokens"] == 4
    assert result.meta_info["finish_reason"] == {"type": "stop", "matched": "\n"}


async def test_json_schema_is_a_forced_tool():
    server = AServer(reply([tool({"x": 1})]), reply([tool({"value": [1, 2]})]))
    b = backend(server)
    obj = {"type": "object", "properties": {"x": {"type": "integer"}}}
    [r] = await b.generate(CTX, SamplingParams(), Constraint("json_schema", obj))
    assert json.loads(r.text) == {"x": 1}
    assert server.bodies[0]["tools"][0]["input_schema"] == obj
    assert server.bodies[0]["tool_choice"] == {"type": "tool", "name": "answer"}
    arr = {"type": "array", "items": {"type": "integer"}}
    [r] = await b.generate(CTX, SamplingParams(), Constraint("json_schema", json.dumps(arr)))
    assert json.loads(r.text) == [1, 2]  # a non-object schema is wrapped and unwrapped
    assert server.bodies[1]["tools"][0]["input_schema"]["properties"]["value"] == arr


async def test_select_uses_a_forced_enum_tool():
    server = AServer(reply([tool({"choice": "no"})]))
    result = await backend(server).select(CTX, ["yes", "no"], 0.0, token_length_normalized)
    assert result.index == 1
    props = server.bodies[0]["tools"][0]["input_schema"]["properties"]
    assert props["choice"]["enum"] == ["yes", "no"]


async def test_images_are_base64_blocks_and_n_issues_n_requests():
    server = AServer(reply([text("a")]), reply([text("b")]))
    ctx = Context(text="", messages=(Message("user", "What?", images=(ImageData(b"GIF", "image/gif"),)),))
    results = await backend(server).generate(ctx, SamplingParams(n=2))
    assert sorted(r.text for r in results) == ["a", "b"] and len(server.bodies) == 2
    assert server.bodies[0]["messages"][0]["content"] == [
        {"type": "image", "source": {"type": "base64", "media_type": "image/gif", "data": "R0lG"}},
        {"type": "text", "text": "What?"}]


async def test_unsupported_settings_are_refused():
    server = AServer()
    with pytest.raises(UnsupportedError, match="logprobs"):
        await backend(server).generate(CTX, SamplingParams(return_logprob=True))
    with pytest.raises(UnsupportedError, match="regex"):
        await backend(server).generate(CTX, SamplingParams(), Constraint("regex", "a"))
    with pytest.raises(UnsupportedError, match="min_tokens"):
        await backend(server).generate(CTX, SamplingParams(min_tokens=3))
    assert server.bodies == []


async def test_errors_name_backend_and_status():
    server = AServer((400, {"type": "error", "error": {"type": "invalid_request_error",
                                                       "message": "max_tokens: too big"}}))
    with pytest.raises(BackendError, match=r"Anthropic backend.*HTTP 400.*too big") as info:
        await backend(server).generate(CTX, SamplingParams())
    assert info.value.status == 400


async def test_stream_events():
    events = [
        ("message_start", {"type": "message_start", "message": {**reply([]), "usage": {
            "input_tokens": 5, "output_tokens": 0}}}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": text("")}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "text_delta", "text": "Hel"}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "text_delta", "text": "lo"}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "max_tokens",
                           "stop_sequence": None}, "usage": {"output_tokens": 2}}),
        ("message_stop", {"type": "message_stop"}),
    ]
    sse = b"".join(f"event: {n}\ndata: {json.dumps(d)}\n\n".encode() for n, d in events)
    chunks = [c async for c in backend(AServer(sse)).stream(CTX, SamplingParams())]
    assert [c.text for c in chunks] == ["Hel", "lo", ""]
    assert chunks[-1].meta_info["prompt_tokens"] == 5
    assert chunks[-1].meta_info["completion_tokens"] == 2
    assert chunks[-1].meta_info["finish_reason"]["type"] == "length"
