"""The official ``anthropic`` client (sync and async, streaming and not) against the real
server with the embedded model."""
from __future__ import annotations

import anthropic
import pytest

from .conftest import API_KEY, Served

MESSAGES = [{"role": "user", "content": [{"type": "text", "text": "Name a color."}]}]
# NOTE: this anthropic client takes sampling fields only through extra_body (same JSON).
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def client(real_server: Served) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=real_server.url, api_key=API_KEY, max_retries=0)


def test_message_and_stream_agree(client: anthropic.Anthropic, real_server: Served) -> None:
    msg = client.messages.create(model=real_server.model, max_tokens=8, extra_body=GREEDY,
                                 system="You answer in one word.", messages=MESSAGES)
    assert msg.role == "assistant" and msg.content[0].type == "text"
    text = msg.content[0].text
    assert text and msg.stop_reason in ("end_turn", "max_tokens")
    assert msg.usage.input_tokens > 5 and 0 < msg.usage.output_tokens <= 8
    with client.messages.stream(model=real_server.model, max_tokens=8, extra_body=GREEDY,
                                system="You answer in one word.", messages=MESSAGES) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert final.content[0].text == text
    assert final.usage.output_tokens == msg.usage.output_tokens
    assert final.usage.input_tokens == msg.usage.input_tokens
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert {"content_block_start", "content_block_stop", "message_delta"} <= set(kinds)


def test_stop_sequences(client: anthropic.Anthropic, real_server: Served) -> None:
    first = client.messages.create(model=real_server.model, max_tokens=8, extra_body=GREEDY,
                                   messages=MESSAGES).content[0].text
    assert len(first) > 1
    stop = first[1:3] if len(first) > 2 else first[-1]
    msg = client.messages.create(model=real_server.model, max_tokens=8, extra_body=GREEDY,
                                 messages=MESSAGES, stop_sequences=[stop])
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == stop
    assert msg.content[0].text == first[:first.index(stop)]


async def test_async_client(real_server: Served) -> None:
    client = anthropic.AsyncAnthropic(base_url=real_server.url, api_key=API_KEY, max_retries=0)
    msg = await client.messages.create(model=real_server.model, max_tokens=6, extra_body=GREEDY,
                                       messages=MESSAGES)
    parts = []
    async with client.messages.stream(model=real_server.model, max_tokens=6, extra_body=GREEDY,
                                      messages=MESSAGES) as stream:
        async for text in stream.text_stream:
            parts.append(text)
    assert "".join(parts) == msg.content[0].text
    await client.close()
