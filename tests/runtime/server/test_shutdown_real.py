"""SIGTERM: in-flight requests drain, then the server exits leaving no child process."""
from __future__ import annotations

import json
import signal
import threading
import time

from .conftest import start_real_server
from processes import descendants, pid_alive


def test_sigterm_drains_then_exits_without_children(tiny_model_dir) -> None:
    # the tiny random model: draining and exiting do not depend on the weights, and loading
    # the embedded model's costs the 2-core CI box seconds (the session's real_server has it)
    served = start_real_server("--model", str(tiny_model_dir), "--load-format", "dummy")
    assert served.proc is not None
    kids = descendants(served.proc.pid)
    assert kids, "the engine's scheduler process should be a child of the server"
    chunks: list[dict] = []
    done = threading.Event()

    def stream() -> None:
        body = {"text": "Write a poem.", "stream": True,
                "sampling_params": {"max_new_tokens": 24, "ignore_eos": True}}
        with served.client() as client, client.stream("POST", "/generate", json=body) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[6:]))
                if line == "data: [DONE]":
                    done.set()

    reader = threading.Thread(target=stream)
    reader.start()
    while not chunks:
        assert reader.is_alive(), "stream ended before its first token"
        time.sleep(0.01)
    served.proc.send_signal(signal.SIGTERM)
    reader.join(timeout=300)
    assert done.is_set(), "the in-flight stream was cut instead of drained"
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert chunks[-1]["meta_info"]["completion_tokens"] == 24
    served.proc.wait(timeout=120)
    deadline = time.monotonic() + 30
    while any(pid_alive(pid) for pid in kids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in kids if pid_alive(pid)], "child process left behind"
    # uvicorn re-raises the signal it handled once it is done: a SIGTERM exit status
    assert served.proc.returncode in (0, -signal.SIGTERM), served.proc.returncode
