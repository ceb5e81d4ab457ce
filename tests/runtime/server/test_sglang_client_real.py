"""SGLang's own client, on the wire: the exact JSON bodies ``sglang.RuntimeEndpoint`` sends
(generate, stream, cache_prefix, select, flush_cache), and ``stop_regex`` on the native and
OpenAI routes against the real server with the embedded model."""
from __future__ import annotations

import json

import openai

from .conftest import API_KEY, Served

PROMPT = "The capital of France is"


def _srt_sampling(**over) -> dict:
    """``SglSamplingParams.to_srt_kwargs()`` of a gen with SGLang's defaults, plus the two
    global_config fields ``RuntimeEndpoint.generate`` prepends."""
    body = {"skip_special_tokens": True, "spaces_between_special_tokens": True,
            "max_new_tokens": 4, "min_new_tokens": 0, "n": 1, "stop": [], "stop_token_ids": [],
            "stop_regex": [], "temperature": 0, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
            "frequency_penalty": 0.0, "presence_penalty": 0.0, "ignore_eos": False,
            "regex": None, "json_schema": None}
    return body | over


def _sse(text: str) -> list[dict]:
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_runtime_endpoint_bodies_are_accepted(real_server: Served) -> None:
    with real_server.client() as client:
        gen = client.post("/generate", json={"text": PROMPT, "sampling_params": _srt_sampling()})
        assert gen.status_code == 200, gen.text
        assert gen.json()["meta_info"]["completion_tokens"] > 0
        stream = client.post("/generate", json={"text": PROMPT, "stream": True,
                                                "sampling_params": _srt_sampling()})
        assert stream.status_code == 200 and _sse(stream.text)[-1]["text"] == gen.json()["text"]
        cache = client.post("/generate", json={"text": PROMPT,
                                               "sampling_params": {"max_new_tokens": 0}})
        assert cache.status_code == 200 and cache.json()["text"] == ""
        select = client.post("/generate", json={
            "text": [PROMPT + " Paris", PROMPT + " Rome"],
            "sampling_params": {"max_new_tokens": 0, "temperature": 0},
            "return_logprob": True, "return_text_in_logprobs": True, "logprob_start_len": 3})
        assert select.status_code == 200 and len(select.json()) == 2
        ids = [[t[1] for t in r["meta_info"]["input_token_logprobs"]] for r in select.json()]
        uncond = client.post("/generate", json={"input_ids": ids, "return_logprob": True,
                                                "sampling_params": {"max_new_tokens": 0}})
        assert uncond.status_code == 200
        assert client.post("/flush_cache", json={"empty_cache": True}).status_code == 200
        join = client.post("/concate_and_append_request",  # fork(...).join("concate_and_append")
                           json={"src_rids": ["a", "b"], "dst_rid": "c"})
        assert join.status_code == 200 and join.json()["success"] is True
        bad = client.post("/concate_and_append_request", json={"src_rids": "a"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "src_rids", bad.text


def test_generate_req_input_fields(real_server: Served) -> None:
    """Null logprob options mean the defaults; routing/metrics hints are ignored; a feature
    this runtime lacks is refused naming the field."""
    with real_server.client() as client:
        ok = client.post("/generate", json={
            "text": PROMPT, "sampling_params": _srt_sampling(), "return_logprob": None,
            "logprob_start_len": None, "top_logprobs_num": None, "log_metrics": True,
            "priority": 1, "custom_labels": {"team": "a"}, "lora_path": None})
        assert ok.status_code == 200, ok.text
        bad = client.post("/generate", json={"text": PROMPT, "lora_path": "adapter"})
        assert bad.status_code == 400 and "lora_path" in bad.text
        bad = client.post("/generate", json={"text": PROMPT, "no_such_field": 1})
        assert bad.status_code in (400, 422) and "no_such_field" in bad.text
        bad = client.post("/generate", json={"text": PROMPT,
                                             "sampling_params": {"stop_regex": "(("}})
        assert bad.status_code == 400 and "stop_regex" in bad.text


def test_stop_regex_native_stream_and_plain(real_server: Served) -> None:
    # The regex constraint forces the text, so the stop regex's match is deterministic.
    sp = _srt_sampling(max_new_tokens=24, regex="Room 1234 is on floor 5", stop_regex=[r"\d+"])
    with real_server.client() as client:
        out = client.post("/generate", json={"text": PROMPT, "sampling_params": sp}).json()
        assert out["text"] == "Room "
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": r"\d+"}
        chunks = _sse(client.post("/generate", json={"text": PROMPT, "sampling_params": sp,
                                                     "stream": True}).text)
        assert chunks[-1]["text"] == "Room "
        assert chunks[-1]["meta_info"]["finish_reason"]["matched"] == r"\d+"
        keep = client.post("/generate", json={"text": PROMPT, "sampling_params": sp | {
            "no_stop_trim": True, "stop_regex": r"floor \d"}}).json()
        assert keep["text"] == "Room 1234 is on floor 5"


def test_stop_regex_on_the_openai_routes(real_server: Served) -> None:
    client = openai.OpenAI(base_url=real_server.url + "/v1", api_key=API_KEY)
    extra = {"regex": r"Answer: 42\. Done\.", "stop_regex": [r"\d+\."]}
    comp = client.completions.create(model=real_server.model, prompt=PROMPT, max_tokens=16,
                                     temperature=0, extra_body=extra)
    assert comp.choices[0].text == "Answer: " and comp.choices[0].finish_reason == "stop"
    chat = client.chat.completions.create(
        model=real_server.model, messages=[{"role": "user", "content": "Say it"}],
        max_tokens=16, temperature=0, extra_body=extra, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chat if c.choices) == "Answer: "
