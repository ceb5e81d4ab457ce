"""Bad requests per protocol against the real server: the right 4xx and each protocol's own
error shape, never a 500."""
from __future__ import annotations

from typing import Any

import httpx
import pytest

from .conftest import API_KEY, Served

MODEL = "{model}"  # replaced by the served model name
CHAT = [{"role": "user", "content": "hi"}]
LONG = "word " * 9000  # longer than the model's context window

# (name, method, path, body (None: malformed JSON), headers override, status)
CASES: list[tuple[str, str, str, Any, dict | None, int]] = [
    # SGLang-native
    ("native-no-prompt", "POST", "/generate", {"sampling_params": {}}, None, 400),
    ("native-both-prompts", "POST", "/generate", {"text": "a", "input_ids": [1]}, None, 400),
    ("native-bad-temperature", "POST", "/generate",
     {"text": "a", "sampling_params": {"temperature": -1}}, None, 400),
    ("native-unknown-param", "POST", "/generate",
     {"text": "a", "sampling_params": {"bogus": 1}}, None, 400),
    ("native-unknown-field", "POST", "/generate", {"text": "a", "bogus": 1}, None, 400),
    ("native-malformed", "POST", "/generate", None, None, 400),
    ("native-too-long", "POST", "/generate",
     {"text": LONG, "sampling_params": {"max_new_tokens": 4}}, None, 400),
    ("native-stream-too-long", "POST", "/generate",
     {"text": LONG, "stream": True, "sampling_params": {"max_new_tokens": 4}}, None, 400),
    ("native-no-key", "POST", "/generate", {"text": "a"}, {}, 401),
    ("native-unknown-route", "GET", "/nope", {}, None, 404),
    # OpenAI
    ("openai-unknown-model", "POST", "/v1/chat/completions",
     {"model": "gpt-nope", "messages": CHAT}, None, 404),
    ("openai-no-messages", "POST", "/v1/chat/completions", {"model": MODEL, "messages": []},
     None, 400),
    ("openai-bad-role", "POST", "/v1/chat/completions",
     {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, None, 400),
    ("openai-bad-temperature", "POST", "/v1/chat/completions",
     {"model": MODEL, "messages": CHAT, "temperature": 3}, None, 400),
    ("openai-bad-top-logprobs", "POST", "/v1/chat/completions",
     {"model": MODEL, "messages": CHAT, "logprobs": True, "top_logprobs": 99}, None, 400),
    ("openai-bad-n", "POST", "/v1/completions", {"model": MODEL, "prompt": "a", "n": 0}, None,
     400),
    ("openai-unknown-field", "POST", "/v1/completions",
     {"model": MODEL, "prompt": "a", "bogus": True}, None, 400),
    ("openai-malformed", "POST", "/v1/chat/completions", None, None, 400),
    ("openai-too-long", "POST", "/v1/completions",
     {"model": MODEL, "prompt": LONG, "max_tokens": 4}, None, 400),
    ("openai-stream-too-long", "POST", "/v1/chat/completions",
     {"model": MODEL, "messages": [{"role": "user", "content": LONG}], "max_tokens": 4,
      "stream": True}, None, 400),
    ("openai-bad-key", "GET", "/v1/models", None, {"Authorization": "Bearer wrong"}, 401),
    ("openai-unknown-model-get", "GET", "/v1/models/nope", None, None, 404),
    # Anthropic
    ("anthropic-no-max-tokens", "POST", "/v1/messages", {"model": MODEL, "messages": CHAT},
     None, 400),
    ("anthropic-unknown-model", "POST", "/v1/messages",
     {"model": "claude-nope", "max_tokens": 4, "messages": CHAT}, None, 404),
    ("anthropic-bad-role", "POST", "/v1/messages",
     {"model": MODEL, "max_tokens": 4, "messages": [{"role": "system", "content": "x"}]},
     None, 400),
    ("anthropic-bad-block", "POST", "/v1/messages",
     {"model": MODEL, "max_tokens": 4,
      "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, None, 400),
    ("anthropic-bad-temperature", "POST", "/v1/messages",
     {"model": MODEL, "max_tokens": 4, "messages": CHAT, "temperature": 1.5}, None, 400),
    ("anthropic-malformed", "POST", "/v1/messages", None, None, 400),
    ("anthropic-too-long", "POST", "/v1/messages",
     {"model": MODEL, "max_tokens": 4, "stream": True,
      "messages": [{"role": "user", "content": LONG}]}, None, 400),
    ("anthropic-bad-key", "POST", "/v1/messages",
     {"model": MODEL, "max_tokens": 4, "messages": CHAT}, {"x-api-key": "wrong"}, 401),
]


def _check_shape(path: str, status: int, body: dict) -> None:
    if path.startswith("/v1/messages"):
        assert body["type"] == "error"
        assert set(body["error"]) == {"type", "message"} and body["error"]["message"]
        expected = {400: "invalid_request_error", 401: "authentication_error",
                    404: "not_found_error"}[status]
        assert body["error"]["type"] == expected
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert body["error"]["message"]


@pytest.mark.parametrize("name,method,path,body,headers,status", CASES,
                         ids=[c[0] for c in CASES])
def test_bad_request(real_server: Served, name: str, method: str, path: str, body: Any,
                     headers: dict | None, status: int) -> None:
    hdrs = {"Authorization": f"Bearer {API_KEY}"} if headers is None else headers
    if body is None and method == "POST":
        kw: dict[str, Any] = {"content": b'{"text": "unterminated',
                              "headers": {**hdrs, "content-type": "application/json"}}
    else:
        if isinstance(body, dict) and body.get("model") == MODEL:
            body = {**body, "model": real_server.model}
        kw = {"json": body, "headers": hdrs} if method == "POST" else {"headers": hdrs}
    resp = httpx.request(method, real_server.url + path, timeout=60, **kw)
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    _check_shape(path, status, resp.json())
