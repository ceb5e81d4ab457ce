"""OpenAI backend request shapes and response handling, through the official client against
an httpx MockTransport."""
from __future__ import annotations

import json

import httpx
import pytest

from sgdsl.backends.base import BackendError, Context, ImageData, Message, UnsupportedError
from sgdsl.backends.openai import OpenAI
from sgdsl.choices import token_length_normalized
from sgdsl.ir import Constraint, SamplingParams


def chat_reply(contents: list[str], finish: str = "stop", usage: tuple = (7, 4)) -> dict:
    return {"id": "c1", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": i, "message": {"role": "assistant", "content": c},
                         "finish_reason": finish, "logprobs": None} for i, c in enumerate(contents)],
            "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1],
                      "total_tokens": sum(usage)}}


class Server:
    """Records request bodies; answers with the queued replies (a dict, or (status, body))."""

    def __init__(self, *replies, http=httpx) -> None:
        self.http = http  # httpx, or httpx2 for clients built on it
        self.replies = list(replies)
        self.bodies: list[dict] = []
        self.paths: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        httpx = self.http
        self.bodies.append(json.loads(request.content))
        self.paths.append(request.url.path)
        reply = self.replies.pop(0)
        if isinstance(reply, bytes):
            return httpx.Response(200, content=reply, headers={"content-type": "text/event-stream"})
        status, body = reply if isinstance(reply, tuple) else (200, reply)
        return httpx.Response(status, json=body)


def backend(server: Server, **kw) -> OpenAI:
    client = httpx.AsyncClient(transport=httpx.MockTransport(server))
    return OpenAI(kw.pop("model", "m"), base_url="http://127.0.0.1:1/v1", api_key="k",
                  http_client=client, max_retries=0, **kw)


CTX = Context(text="", messages=(Message("system", "Be brief."), Message("user", "Hi?"),
                                 Message("assistant", "")), open_role="assistant")


async def test_chat_request_and_usage_split():
    server = Server(chat_reply(["a", "b"], finish="length", usage=(7, 5)))
    results = await backend(server).generate(CTX, SamplingParams(max_tokens=3, n=2, temperature=0.5))
    body = server.bodies[0]
    assert body["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Hi?"}]  # empty open turn dropped
    assert (body["max_tokens"], body["n"], body["temperature"]) == (3, 2, 0.5)
    assert [r.text for r in results] == ["a", "b"]
    assert [r.meta_info["completion_tokens"] for r in results] == [3, 2]
    assert results[0].meta_info["prompt_tokens"] == 7
    assert results[0].meta_info["finish_reason"] == {"type": "length", "length": None}


async def test_json_schema_is_strict_response_format():
    server = Server(chat_reply(['{"x": 1}']))
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    await backend(server).generate(CTX, SamplingParams(), Constraint("json_schema", json.dumps(schema)))
    assert server.bodies[0]["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "output", "schema": schema, "strict": True}}


async def test_regex_and_unknown_params_are_refused_without_a_request():
    server = Server()
    vendor = backend(server, extensions=False)  # what api.openai.com gets
    with pytest.raises(UnsupportedError, match="regex"):
        await vendor.generate(CTX, SamplingParams(), Constraint("regex", "a+"))
    with pytest.raises(UnsupportedError, match="min_tokens"):
        await vendor.generate(CTX, SamplingParams(min_tokens=2))
    assert server.bodies == []
    assert vendor.capabilities.constraints == frozenset({"json_schema", "tools"})
    assert OpenAI("gpt-4o", base_url="https://api.openai.com/v1", api_key="k").extensions is False


async def test_self_hosted_servers_get_regex_and_ebnf_as_body_fields():
    server = Server(chat_reply(["555"]), chat_reply(["a"]))
    b = backend(server)
    assert b.capabilities.constraints == frozenset({"json_schema", "regex", "ebnf", "tools"})
    await b.generate(CTX, SamplingParams(), Constraint("regex", "[0-9]+"))
    await b.generate(CTX, SamplingParams(), Constraint("ebnf", 'root ::= "a"'))
    assert server.bodies[0]["regex"] == "[0-9]+" and "response_format" not in server.bodies[0]
    assert server.bodies[1]["ebnf"] == 'root ::= "a"'


async def test_extensions_go_in_the_body_for_self_hosted_servers():
    server = Server(chat_reply(["a"]))
    await backend(server).generate(CTX, SamplingParams(min_tokens=2, top_k=3, ignore_eos=True))
    body = server.bodies[0]
    assert (body["min_tokens"], body["top_k"], body["ignore_eos"]) == (2, 3, True)


async def test_images_are_data_urls():
    server = Server(chat_reply(["cat"]))
    img = ImageData(b"\x89PNG", "image/png")
    ctx = Context(text="", messages=(Message("user", "What is it?", images=(img,)),))
    await backend(server).generate(ctx, SamplingParams())
    content = server.bodies[0]["messages"][0]["content"]
    assert content == [{"type": "text", "text": "What is it?"},
                       {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw=="}}]


async def test_chat_select_uses_an_enum_schema():
    server = Server(chat_reply(['{"choice": "Paris"}']))
    result = await backend(server).select(CTX, ["London", "Paris"], 0.0, token_length_normalized)
    assert result.index == 1
    schema = server.bodies[0]["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["choice"]["enum"] == ["London", "Paris"]


async def test_completion_model_scores_choices_from_echo_logprobs():
    def choice(i: int, tokens: list[str], lps: list, offsets: list[int]) -> dict:
        return {"index": i, "text": "".join(tokens), "finish_reason": "length",
                "logprobs": {"tokens": tokens, "token_logprobs": lps, "text_offset": offsets,
                             "top_logprobs": None}}
    reply = {"id": "x", "object": "text_completion", "created": 0, "model": "m",
             "choices": [choice(0, ["Q", ":", " A"], [None, -1.0, -0.5], [0, 1, 2]),
                         choice(1, ["Q", ":", " B", "ee"], [None, -1.0, -2.0, -0.1], [0, 1, 2, 4])],
             "usage": {"prompt_tokens": 7, "completion_tokens": 0, "total_tokens": 7}}
    server = Server(reply)
    b = backend(server, model="m-instruct")
    assert b.capabilities.prompt_logprobs and not b.capabilities.chat_only
    scores = await b.score_choices(Context(text="Q:"), [" A", " Bee"])
    assert scores.token_logprobs == ((-0.5,), (-2.0, -0.1))
    assert server.bodies[0]["echo"] is True and server.bodies[0]["max_tokens"] == 0
    assert server.paths == ["/v1/completions"]


async def test_errors_name_backend_and_status():
    server = Server((400, {"error": {"message": "bad temperature", "type": "invalid_request_error"}}))
    with pytest.raises(BackendError, match=r"OpenAI backend.*HTTP 400.*bad temperature") as info:
        await backend(server).generate(CTX, SamplingParams(temperature=9.0))
    assert info.value.status == 400 and info.value.__cause__ is not None


async def test_partial_assistant_turn_is_refused():
    ctx = Context(text="", messages=(Message("user", "Hi"), Message("assistant", "Sure,")),
                  open_role="assistant")
    with pytest.raises(UnsupportedError, match="partly written"):
        await backend(Server()).generate(ctx, SamplingParams())


async def test_stream_parses_deltas_and_usage():
    def chunk(content, finish=None, usage=None):
        choices = [] if content is None else [
            {"index": 0, "delta": {"content": content}, "finish_reason": finish}]
        return {"id": "s", "object": "chat.completion.chunk", "created": 0, "model": "m",
                "choices": choices, "usage": usage}
    events = [chunk("Hel"), chunk("lo", "stop"),
              chunk(None, usage={"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5})]
    sse = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    server = Server(sse)
    chunks = [c async for c in backend(server).stream(CTX, SamplingParams())]
    assert [c.text for c in chunks] == ["Hel", "lo", ""]
    assert chunks[-1].done and chunks[-1].meta_info["completion_tokens"] == 2
    assert chunks[-1].meta_info["finish_reason"] == {"type": "stop"}
    assert server.bodies[0]["stream"] is True
