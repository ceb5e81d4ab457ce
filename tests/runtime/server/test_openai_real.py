"""The official ``openai`` client (sync and async, streaming and not) against the real server
with the embedded model."""
from __future__ import annotations

import openai
import pytest

from .conftest import API_KEY, Served

MESSAGES = [{"role": "user", "content": "Name a fruit."}]


@pytest.fixture(scope="module")
def client(real_server: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=real_server.url + "/v1", api_key=API_KEY, max_retries=0)


def test_models(client: openai.OpenAI, real_server: Served) -> None:
    ids = [m.id for m in client.models.list().data]
    assert ids == [real_server.model]
    assert client.models.retrieve(real_server.model).id == real_server.model


def test_chat_stream_equals_plain_and_usage_adds_up(client: openai.OpenAI,
                                                     real_server: Served) -> None:
    plain = client.chat.completions.create(model=real_server.model, messages=MESSAGES,
                                           max_tokens=8, temperature=0)
    text = plain.choices[0].message.content
    assert text and plain.choices[0].message.role == "assistant"
    u = plain.usage
    assert u.completion_tokens > 0 and u.prompt_tokens > 5
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    stream = client.chat.completions.create(model=real_server.model, messages=MESSAGES,
                                            max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    assert chunks[-1].usage.total_tokens == u.total_tokens
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == plain.choices[0].finish_reason and reasons.count(None) == len(reasons) - 1


def test_chat_n_seed_stop_and_max_completion_tokens(client: openai.OpenAI,
                                                    real_server: Served) -> None:
    out = client.chat.completions.create(model=real_server.model, messages=MESSAGES, n=2,
                                         seed=7, temperature=1.0, max_completion_tokens=6)
    assert [c.index for c in out.choices] == [0, 1]
    assert 2 <= out.usage.completion_tokens <= 12  # both samples counted, each <= 6
    again = client.chat.completions.create(model=real_server.model, messages=MESSAGES, n=2,
                                           seed=7, temperature=1.0, max_completion_tokens=6)
    assert [c.message.content for c in again.choices] == [c.message.content for c in out.choices]
    assert all(c.finish_reason in ("stop", "length") for c in out.choices)
    first = client.chat.completions.create(model=real_server.model, messages=MESSAGES,
                                           max_tokens=8, temperature=0).choices[0].message.content
    stop = first.strip().split()[1] if len(first.split()) > 1 else first.strip()[-1]
    cut = client.chat.completions.create(model=real_server.model, messages=MESSAGES,
                                         max_tokens=8, temperature=0, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert stop not in cut.choices[0].message.content


def test_chat_logprobs(client: openai.OpenAI, real_server: Served) -> None:
    out = client.chat.completions.create(model=real_server.model, messages=MESSAGES,
                                         max_tokens=4, temperature=0, logprobs=True,
                                         top_logprobs=3)
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens
    assert "".join(t.token for t in content) == out.choices[0].message.content
    for tok in content:
        assert tok.logprob <= 0 and len(tok.top_logprobs) == 3
        # greedy: the chosen token is the most likely one
        assert tok.top_logprobs[0].logprob == pytest.approx(tok.logprob, abs=1e-4)


def test_completions_plain_stream_and_logprobs(client: openai.OpenAI,
                                               real_server: Served) -> None:
    plain = client.completions.create(model=real_server.model, prompt="One, two, three,",
                                      max_tokens=6, temperature=0, logprobs=2)
    choice = plain.choices[0]
    assert choice.text and len(choice.logprobs.tokens) == plain.usage.completion_tokens
    assert "".join(choice.logprobs.tokens) == choice.text
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=real_server.model, prompt="One, two, three,", max_tokens=6, temperature=0,
        stream=True) if c.choices)
    assert streamed == choice.text
    batch = client.completions.create(model=real_server.model, prompt=["a", "b c"],
                                      max_tokens=2, temperature=0)
    assert len(batch.choices) == 2 and batch.usage.completion_tokens <= 4


async def test_async_client_chat_and_stream(real_server: Served) -> None:
    client = openai.AsyncOpenAI(base_url=real_server.url + "/v1", api_key=API_KEY, max_retries=0)
    plain = await client.chat.completions.create(model=real_server.model, messages=MESSAGES,
                                                 max_tokens=6, temperature=0)
    parts = []
    async for chunk in await client.chat.completions.create(
            model=real_server.model, messages=MESSAGES, max_tokens=6, temperature=0,
            stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    assert "".join(parts) == plain.choices[0].message.content
    await client.close()
