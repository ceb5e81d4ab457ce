"""``sgl.Runtime``: the server in a subprocess with the embedded model, driven as a
RuntimeEndpoint, then shut down with nothing left running."""
from __future__ import annotations

import pytest

import sgdsl as sgl
from e2e_programs import few_shot_qa

pytestmark = pytest.mark.slow  # starts a server process with the embedded model


def test_runtime_starts_serves_and_shuts_down():
    # no grammar backend (the program sends none): its compile and estimate workers are
    # three processes that import torch, seconds of the 2-core CI box's CPU at start-up
    runtime = sgl.Runtime(max_total_tokens=4096, grammar_backend="none")
    try:
        state = few_shot_qa.run(question="What is the capital of France?", backend=runtime)
        assert state["answer"].strip() and state.get_meta_info("answer")["prompt_tokens"] > 0
        assert runtime.get_server_info()["max_total_tokens"] == 4096
        assert runtime.flush_cache() is True and sgl.flush_cache(runtime) is True
        proc = runtime.process
    finally:
        runtime.shutdown()
    assert proc.poll() is not None and runtime.process is None
    runtime.shutdown()  # idempotent
