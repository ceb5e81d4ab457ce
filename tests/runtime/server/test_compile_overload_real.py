"""An overloaded grammar compile queue on the real server (issue 29, item 3): a valid request
that would wait too long for a compile worker is answered 503 with ``Retry-After`` in each
protocol's error shape (OpenAI through the official client, Anthropic through its client,
SGLang-native), never 400 and never blaming the schema; once the queue drains, the same
request is served.

The server runs one compile worker and allows no wait (``--grammar-compile-max-wait-s 0``);
a slow regex (seconds of compile) holds the worker, and the test waits until ``/metrics``
shows it compiling before sending the others, so no outcome depends on the machine's speed.

Then, on the same server (one start for both: CI time), ``POST /precompile``
(runtime/server/native.py): each constraint's verdict, compiled once and found by later
requests; the compiles land in the grammar disk cache folder given by ``--grammar-cache-dir``.
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
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("precompile-cache")


@pytest.fixture(scope="module")
def served(tiny_model_dir, cache_dir):
    # NOTE: the tiny random model (the embedded model's tokenizer, so the same compiles): the
    # queue's answers depend on the compile worker, not on the text; a load of the embedded
    # model would only add start-up time on the CI box.
    served = start_real_server("--model", str(tiny_model_dir), "--load-format", "dummy",
                               "--grammar-compile-workers", "1", "--grammar-compile-max-wait-s",
                               "0", "--grammar-compile-timeout-s", "120",
                               "--grammar-cache-dir", str(cache_dir))
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
    # the queue's gauge (empty now) and the compile-time histogram (the warm-up probe, the slow
    # regex, the schema served after the drain)
    assert _metric(metrics, "sgdsl_engine_grammar_compile_queue_depth") == 0
    assert _metric(metrics, "sgdsl_engine_grammar_compile_seconds_count") >= 3
    assert _metric(metrics, "sgdsl_engine_grammar_compile_seconds_sum") > 0


def _metric(text: str, name: str) -> float:
    """A sample's value in a Prometheus text exposition (``name value`` lines)."""
    values = [float(line.split()[1]) for line in text.splitlines()
              if line.startswith(name + " ")]
    assert len(values) == 1, (name, values)
    return values[0]


PRECOMPILE_SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 10}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"]}
CONSTRAINTS = [{"json_schema": PRECOMPILE_SCHEMA}, {"regex": r"(yes|no)-[0-9]{3}"},
               {"ebnf": 'root ::= "ab" | "c" root'}]
INVALID = [{"regex": "(unclosed"}, {"json_schema": {"type": "nosuchtype"}}]


def test_precompile_route(served, cache_dir):
    # NOTE: after the overload test (its compiles are in the counts and on disk too); with one
    # worker and no queue wait, the precompile's own busy refusals are submitted again later
    with served.client() as client:
        before = client.get("/get_server_info").json()["grammar_compiles"]
        r = client.post("/precompile", json={"constraints": CONSTRAINTS + INVALID})
        assert r.status_code == 200, r.text
        assert [x["ok"] for x in r.json()["results"]] == [True] * 3 + [False] * 2
        assert client.post("/precompile", json={"schemas": []}).status_code == 400
        compiled = client.get("/get_server_info").json()["grammar_compiles"]
        assert compiled == before + 3
        r = client.post("/generate", json={"text": "Answer:", "sampling_params": {
            "json_schema": json.dumps(PRECOMPILE_SCHEMA), "max_new_tokens": 24,
            "temperature": 0}})
        assert r.status_code == 200, r.text
        assert client.get("/get_server_info").json()["grammar_compiles"] == compiled
        assert client.get("/debug/check_idle_integrity").status_code == 200
        metrics = client.get("/metrics").text  # the counters reach Prometheus too
        assert f"sgdsl_engine_grammar_compiles {float(compiled)}" in metrics
        assert "sgdsl_engine_grammar_disk_cache_misses" in metrics
    for _ in range(1200):  # written off the request's path; bounded, not timed
        if len(list(cache_dir.rglob("*.grammar"))) >= compiled:
            break
        time.sleep(0.1)
    assert len(list(cache_dir.rglob("*.grammar"))) == compiled
