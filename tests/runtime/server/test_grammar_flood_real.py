"""A flood of slow and memory-hungry grammars against the real server (issue 15, item 4): every
request is answered (200, or 400 naming the deadline, memory or queue limit), the server and its
scheduler survive, memory stays bounded, a stream running meanwhile finishes, and shutdown leaves
no compile worker behind. Decode speed during the flood is measured by
benchmarks/bench_grammar_flood.py, not asserted here."""
from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from .conftest import Served, start_real_server, stop_real_server
from processes import descendants, pid_alive

pytestmark = pytest.mark.slow

TIMEOUT_S = 1  # CPU seconds: each slow compile below needs several; a killed one costs this much
MEMORY_BYTES = 512 << 20
# Regexes that take seconds to tens of seconds and hundreds of MB to compile: a long bounded
# run of "any character but a quote" (outlines: one DFA state per position times the whole
# vocabulary; xgrammar: likewise for its token masks). Each request gets a distinct bound so the
# cache cannot answer it.
SLOW = {"outlines": lambda i: '[^"]{0,%d}' % (90 + 7 * i),
        "xgrammar": lambda i: '[^"]{0,%d}' % (700 + 13 * i)}
# 2 compiling, 2 queued, the rest refused (503) or past a limit (400): every outcome once, with
# the fewest slow compiles (each costs up to the deadline and a worker's restart)
FLOOD = 6
QUEUE = 2
LIMIT_WORDS = (f"within the {TIMEOUT_S} s deadline", f"more than the {MEMORY_BYTES} bytes")
QUEUE_WORDS = ("grammar_compile_queue", "grammar_compile_max_wait_s")
RSS_BOUND = 8 << 30  # the whole server tree; a safety net far above what the limits allow


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            pass
    return total


class TreeWatch:
    """Samples the server tree every 100 ms: the pids ever seen and the peak RSS."""

    def __init__(self, root: int) -> None:
        self.root, self.seen, self.peak = root, set(), 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            pids = [self.root, *descendants(self.root)]
            self.seen.update(pids)
            self.peak = max(self.peak, rss_bytes(pids))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _generate(served: Served, params: dict[str, Any]) -> tuple[int, dict]:
    # NOTE: no read timeout: on a loaded box the flood's compiles (each bounded by its CPU
    # deadline) and the workers' restarts may take minutes of wall time, and every client must
    # still be answered; pytest-timeout ends a real hang.
    with served.client(timeout=None) as client:
        resp = client.post("/generate", json={"text": "Say something:", "sampling_params": params})
    body = resp.json()
    if resp.status_code == 503:  # the queue's answer: retryable, says when
        body["retry_after"] = resp.headers.get("retry-after")
    return resp.status_code, body


def _stream(served: Served, out: dict) -> None:
    body = {"text": "Write a long story.", "stream": True,
            "sampling_params": {"max_new_tokens": 48, "ignore_eos": True, "temperature": 0}}
    with served.client(timeout=None) as client, \
            client.stream("POST", "/generate", json=body) as resp:
        out["status"] = resp.status_code
        out["events"] = [line for line in resp.iter_lines() if line.startswith("data: ")]


@pytest.mark.parametrize("backend", ["xgrammar", "outlines"])
def test_flood_of_slow_grammars(backend: str, tiny_model_dir) -> None:
    # NOTE: the tiny random model with the embedded model's tokenizer: the same vocabulary, so
    # the same compiles; the flood is about the compile limits and the server surviving, not
    # the text, and the embedded model's load would only add start-up time per backend.
    served = start_real_server(
        "--model", str(tiny_model_dir), "--load-format", "dummy", "--grammar-backend", backend,
        "--grammar-compile-timeout-s", str(TIMEOUT_S),
        "--grammar-compile-memory-bytes", str(MEMORY_BYTES), "--grammar-compile-workers", "2",
        "--grammar-compile-queue", str(QUEUE))
    assert served.proc is not None
    watch = TreeWatch(served.proc.pid)
    try:
        quick = {"regex": "(yes|no)", "max_new_tokens": 4}
        assert _generate(served, quick)[0] == 200  # starts the workers; cached from now on
        core = [p for p in descendants(served.proc.pid) if not _is_worker(p)]
        stream: dict = {}
        streamer = threading.Thread(target=_stream, args=(served, stream))
        streamer.start()
        floods = [{"regex": SLOW[backend](i), "max_new_tokens": 4} for i in range(FLOOD)]
        with ThreadPoolExecutor(FLOOD + 2) as pool:
            answers = list(pool.map(lambda p: _generate(served, p), floods + [quick, quick]))
        streamer.join()
        _check_answers(answers[:FLOOD])
        assert [a[0] for a in answers[FLOOD:]] == [200, 200]  # a cached grammar is not held up
        assert stream["status"] == 200 and stream["events"][-1] == "data: [DONE]"
        assert served.proc.poll() is None and core  # nobody but compile workers was killed
        assert all(pid_alive(p) for p in core)
        with served.client() as client:
            assert client.get("/debug/check_idle_integrity").status_code == 200
            assert client.get("/metrics").status_code == 200
        assert watch.peak < RSS_BOUND, watch.peak
    finally:
        watch.stop()
        code = stop_real_server(served)
    assert code in (0, -signal.SIGTERM)  # uvicorn re-raises the SIGTERM it handled
    deadline = time.monotonic() + 30
    while any(map(pid_alive, watch.seen)) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [p for p in watch.seen if pid_alive(p)]
    assert not alive, f"left behind: {alive}"  # compile workers included


def _check_answers(answers: list[tuple[int, dict]]) -> None:
    for status, body in answers:
        assert status in (200, 400, 503), (status, body)
        message = body.get("error", {}).get("message", "")
        if status == 400:  # the grammar itself: too slow or too big to compile
            assert body["error"]["param"] == "regex", body
            assert any(w in message for w in LIMIT_WORDS), message
        if status == 503:  # the queue, not the grammar: retryable
            assert any(w in message for w in QUEUE_WORDS), message
            assert int(body["retry_after"]) >= 1, body
    assert any(status in (400, 503) for status, _ in answers)  # the flood was really too much


def _is_worker(pid: int) -> bool:
    """A compile worker: by its process name (its command line is the grammar zygote's when
    it was forked from one; runtime/grammar/compile/zygote.py)."""
    from sgdsl.runtime.grammar.compile.worker import WORKER_NAME

    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip() == WORKER_NAME
    except OSError:
        return False
