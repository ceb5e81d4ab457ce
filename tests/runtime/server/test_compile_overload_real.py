"""An overloaded grammar compile queue on the real server (issue 29, item 3): a valid request
that would wait too long for a compile worker is answered 503 with ``Retry-After`` in each
protocol's error shape (OpenAI through the official client, Anthropic through its client,
SGLang-native), never 400 and never blaming the schema; once the queue drains, the same
request is served.

The server runs one compile worker and allows no wait (``--grammar-compile-max-wait-s 0``);
a slow regex (seconds of compile) holds the worker, and the test waits until ``/metrics``
shows it compiling before sending the others, so no outcome depends on the machine's speed.
"""
from __future__ import annotations

import json
import threading
import time

import anthropic
import openai
import pytest

from .conftest import API_KEY, start_real_server, stop_real_server

pytestmark = pytest.mark.slow
SLOW = '[^"]{0,1000}'  # seconds of xgrammar compile (its token masks, position by position)
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
          "required": ["city"]}


@pytest.fixture(scope="module")
def served(tiny_model_dir):
    # NOTE: the tiny random model (the embedded model's tokenizer, so the same compiles): the
    # queue's answers depend on the compile worker, not on the text; a load of the embedded
    # model would only add start-up time on the CI box.
    served = start_real_server("--model", str(tiny_model_dir), "--load-format", "dummy",
                               "--grammar-compile-workers", "1", "--grammar-compile-max-wait-s",
                               "0", "--grammar-compile-timeout-s", "120")
    yield served
    stop_real_server(served)


def _compiling(served) -> float:
    with served.client() as client:
        text = client.get("/metrics").text
    for line in text.splitlines():
        if line.startswith("sgdsl_engine_grammar_compile_running "):
            return float(line.split()[1])
    return 0.0


def _hold_the_worker(served) -> threading.Thread:
    """A native request whose compile occupies the only worker; returns once it compiles."""
    def run() -> None:
        with served.client() as client:
            client.post("/generate", json={"text": "Say:", "sampling_params": {
                "regex": SLOW, "max_new_tokens": 2}})

    holder = threading.Thread(target=run, daemon=True)
    holder.start()
    for _ in range(6000):  # bounded: 10 min at most, however slow the machine
        if _compiling(served) >= 1:
            return holder
        time.sleep(0.1)
    raise AssertionError("the slow compile never started")


def test_an_overloaded_compile_queue_answers_503_with_retry_after(served):
    holder = _hold_the_worker(served)
    oai = openai.OpenAI(base_url=served.url + "/v1", api_key=API_KEY, max_retries=0)
    with pytest.raises(openai.APIStatusError) as e:
        oai.chat.completions.create(
            model=served.model, messages=[{"role": "user", "content": "A city?"}],
            max_tokens=16, response_format={"type": "json_schema", "json_schema": {
                "name": "city", "schema": SCHEMA}})
    assert e.value.status_code == 503, e.value
    assert int(e.value.response.headers["retry-after"]) >= 1
    error = e.value.response.json()["error"]
    assert error["type"] == "service_unavailable" and error["code"] == "grammar_queue_full"
    assert "grammar_compile_max_wait_s" in error["message"]

    with served.client() as client:  # SGLang-native shape
        resp = client.post("/generate", json={"text": "A city:", "sampling_params": {
            "json_schema": json.dumps({**SCHEMA, "title": "native"}), "max_new_tokens": 8}})
    assert resp.status_code == 503 and int(resp.headers["retry-after"]) >= 1
    assert resp.json()["error"]["type"] == "service_unavailable"

    claude = anthropic.Anthropic(base_url=served.url, api_key=API_KEY, max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as e:
        claude.messages.create(
            model=served.model, max_tokens=32, messages=[{"role": "user", "content": "Weather?"}],
            tools=[{"name": "weather", "description": "Weather of a city",
                    "input_schema": {**SCHEMA, "title": "anthropic"}}],
            tool_choice={"type": "tool", "name": "weather"})
    assert e.value.status_code == 503 and int(e.value.response.headers["retry-after"]) >= 1
    assert e.value.response.json()["error"]["type"] == "overloaded_error"

    holder.join()  # the queue drains: the same request is served now
    done = oai.chat.completions.create(
        model=served.model, messages=[{"role": "user", "content": "A city?"}], max_tokens=16,
        response_format={"type": "json_schema", "json_schema": {"name": "city",
                                                                  "schema": SCHEMA}})
    assert done.choices[0].message.content is not None
    with served.client() as client:
        metrics = client.get("/metrics").text
        assert client.get("/debug/check_idle_integrity").status_code == 200
    assert "sgdsl_engine_grammar_compile_rejected_busy_total 3.0" in metrics
    assert "sgdsl_engine_grammar_compile_wait_seconds_bucket" in metrics
    assert "sgdsl_engine_grammar_compile_cache_hits" in metrics
    assert "sgdsl_engine_grammar_admission_seconds_count" in metrics
