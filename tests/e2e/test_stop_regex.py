"""``gen(stop_regex=...)`` on every backend with the embedded model: natively on the runtime
backends, by cancelling the stream at the match on OpenAI and Anthropic. Whatever the model
writes, no match survives in the variable, and a stop at a match is reported as SGLang does."""
from __future__ import annotations

import re
from typing import Any

import sgdsl as sgl


@sgl.function
def count(s):
    s += sgl.user("Count from 1 to 30, separated by commas.")
    s += sgl.assistant(sgl.gen("x", max_tokens=24, temperature=0, stop_regex=[r"1\d", r"\n\n"]))


def test_stop_regex_on_every_backend(backend: Any) -> None:
    state = count.run(backend=backend)
    text = state["x"]
    assert not re.search(r"1\d|\n\n", text)
    reason = state.get_meta_info("x")["finish_reason"]
    if isinstance(reason, dict) and isinstance(reason.get("matched"), str):
        assert reason["matched"] in (r"1\d", r"\n\n")


def test_backtracking_stop_regex_fails_its_request_and_others_are_served(
        engine: Any, server_url: str) -> None:
    """A stop_regex that backtracks (``re`` takes minutes on the 60 forced a's) fails its own
    request with a 400 naming the field, within seconds; a request sent beside it completes."""
    import concurrent.futures

    import httpx

    hostile = {"text": "Say a.", "sampling_params": {
        "regex": "a{60}", "stop_regex": r"(a|aa)+[bc]$", "max_new_tokens": 80,
        "temperature": 0}}
    normal = {"text": "Count to five:", "sampling_params": {"max_new_tokens": 12,
                                                            "temperature": 0}}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        bad = pool.submit(httpx.post, server_url + "/generate", json=hostile, timeout=60)
        good = pool.submit(httpx.post, server_url + "/generate", json=normal, timeout=60)
        bad, good = bad.result(), good.result()
    assert bad.status_code == 400, bad.text
    assert "stop_regex" in bad.text and "backtracks" in bad.text
    assert good.status_code == 200 and good.json()["meta_info"]["completion_tokens"] == 12
    engine.check_idle_integrity()
