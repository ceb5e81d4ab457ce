"""SGLang-native routes with plain httpx against the real server and the embedded model."""
from __future__ import annotations

import json

from .conftest import Served

PROMPT = "The capital of France is"


def _sse(resp_text: str) -> list:
    events = [line[6:] for line in resp_text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_generate_plain_stream_and_ids(real_server: Served) -> None:
    params = {"max_new_tokens": 6, "temperature": 0}
    with real_server.client() as client:
        out = client.post("/generate", json={"text": PROMPT, "sampling_params": params}).json()
        meta = out["meta_info"]
        assert meta["completion_tokens"] == len(out["output_ids"]) > 0
        assert meta["finish_reason"]["type"] in ("stop", "length")
        resp = client.post("/generate", json={"text": PROMPT, "sampling_params": params,
                                              "stream": True})
        assert resp.headers["content-type"].startswith("text/event-stream")
        chunks = _sse(resp.text)
        texts = [c["text"] for c in chunks]
        assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))  # cumulative
        assert texts[-1] == out["text"] and chunks[-1]["output_ids"] == out["output_ids"]
        ids = client.post("/get_model_info").status_code  # GET only
        assert ids == 405
        prompt_ids = client.post("/generate", json={
            "text": PROMPT, "sampling_params": {"max_new_tokens": 0}}).json()
        assert prompt_ids["meta_info"]["completion_tokens"] == 0 and prompt_ids["text"] == ""


def test_generate_batch_and_logprobs(real_server: Served) -> None:
    body = {"text": [PROMPT, PROMPT + " Paris. The capital of Italy is"],
            "sampling_params": {"max_new_tokens": 2, "temperature": 0},
            "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 2,
            "return_text_in_logprobs": True}
    with real_server.client() as client:
        outs = client.post("/generate", json=body).json()
    assert isinstance(outs, list) and len(outs) == 2
    for out in outs:
        meta = out["meta_info"]
        inp = meta["input_token_logprobs"]
        assert len(inp) == meta["prompt_tokens"] and inp[0][0] is None
        assert all(lp <= 0 and isinstance(tid, int) and isinstance(txt, str)
                   for lp, tid, txt in inp[1:])
        assert [t[1] for t in meta["output_token_logprobs"]] == out["output_ids"]
        assert all(len(top) == 2 for top in meta["output_top_logprobs"])


def test_batch_reports_a_failed_request_in_its_own_output(real_server: Served) -> None:
    """A list answer carries each request's own result; one that failed in the scheduler (a
    regex that does not compile) has SGLang's abort finish_reason with the status, as the
    Engine's list calls report it. The same request alone is an HTTP 400."""
    params = [{"max_new_tokens": 3, "temperature": 0}, {"regex": "(ab", "max_new_tokens": 3}]
    with real_server.client() as client:
        resp = client.post("/generate", json={"text": [PROMPT, "x"], "sampling_params": params})
        assert resp.status_code == 200
        good, bad = resp.json()
        alone = client.post("/generate", json={"text": "x", "sampling_params": params[1]})
    assert good["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    reason = bad["meta_info"]["finish_reason"]
    assert reason["type"] == "abort" and reason["status_code"] == 400
    assert reason["err_type"] == "invalid_request_error" and "regex" in reason["message"]
    assert alone.status_code == 400


def test_info_health_flush(real_server: Served) -> None:
    with real_server.client() as client:
        info = client.get("/get_model_info").json()
        assert info["model_path"] and info["is_generation"] is True
        assert client.get("/model_info").json() == info
        server = client.get("/get_server_info").json()
        assert "num_running_reqs" in server and "api_key" not in server
        assert client.get("/health").status_code == 200
        assert client.get("/health_generate").status_code == 200
        assert client.post("/flush_cache").status_code == 200
