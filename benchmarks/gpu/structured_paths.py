"""The user paths of ``bench_structured_paths.py``: the Engine, ``sgdsl serve`` (its clients are
in ``http_clients.py``, re-exported here), and the language's ``run_batch`` on ``Local`` and
``RuntimeEndpoint``.

Every runner takes the same ``Workload`` (prompts, per-request output budgets, constrained or
not) and returns a ``Run``: wall time from the first submission to the last answer, the output
token count of every request, the outputs' texts and the caller process's CPU seconds (so a
client's own cost shows next to its wall time).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
from person_programs import person_programs  # noqa: E402
from http_clients import (SCHEMA, SCHEMA_TEXT, Run, Workload, aiohttp_transport,  # noqa: F401
                          openai_run, raw_run, sampling, timed)


# ---------------------------------------------------------------- (b) the Engine

def engine_run(engine: Any, w: Workload) -> Run:
    engine.flush_cache()

    def go() -> tuple[list[int], list[str]]:
        outs = engine.generate(input_ids=w.ids,
                               sampling_params=[sampling(w, i) for i in range(len(w.ids))])
        return [len(o["output_ids"]) for o in outs], [o["text"] for o in outs]
    return timed(go)


# ---------------------------------------------------------------- (d) the language

PROGRAMS: list[Any] = []


def language_run(backend: Any, w: Workload) -> Run:
    """``run_batch`` of a ``@function`` with ``gen(json_schema=...)`` (or a free ``gen``)."""
    if not PROGRAMS:
        PROGRAMS.extend(person_programs())
    program = PROGRAMS[0] if w.constrained else PROGRAMS[1]
    backend.flush_cache()
    batch = [{"prompt": t, "budget": b} for t, b in zip(w.texts, w.budgets)]

    def go() -> tuple[list[int], list[str]]:
        states = program.run_batch(batch, backend=backend)
        for state in states:
            if state.error() is not None:
                raise state.error()
        return ([s.get_meta_info("out")["completion_tokens"] for s in states],
                [s["out"] for s in states])
    return timed(go)


# ---------------------------------------------------------------- (c) sgdsl serve + openai

class Server:
    """``python -m sgdsl.runtime.server`` on a free loopback port, until ``stop()``."""

    def __init__(self, flags: list[str], start_timeout_s: float = 600.0,
                 python: str = sys.executable) -> None:
        cmd = [python, "-m", "sgdsl.runtime.server", "--host", "127.0.0.1",
               "--port", "0", *flags]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        found: list[str] = []
        reader = threading.Thread(target=lambda: found.append(self.proc.stdout.readline()),
                                  daemon=True)
        reader.start()
        reader.join(start_timeout_s)
        match = re.search(r"(http://\S+)", found[0]) if found else None
        if match is None:
            self.stop()
            raise RuntimeError(f"server did not start: {found}")
        self.url = match.group(1)

    def flush(self) -> None:
        import httpx

        httpx.post(self.url + "/flush_cache", timeout=60).raise_for_status()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def server_flags(engine_kw: dict[str, Any]) -> list[str]:
    """EngineConfig keyword arguments as ``sgdsl serve`` flags."""
    flags = []
    for key, value in engine_kw.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is not False and value is not None:
            flags += [flag, str(value)]
    return flags


def valid_count(texts: list[str]) -> int:
    ok = 0
    for text in texts:
        try:
            obj = json.loads(text)
        except ValueError:
            continue
        ok += isinstance(obj, dict) and set(obj) == set(SCHEMA["properties"])
    return ok
