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
