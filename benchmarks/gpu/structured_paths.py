"""The user paths of ``bench_structured_paths.py``: the Engine, ``sgdsl serve`` with the official
``openai`` client, and the language's ``run_batch`` on ``Local`` and ``RuntimeEndpoint``.

Every runner takes the same ``Workload`` (prompts, per-request output budgets, constrained or
not) and returns a ``Run``: wall time from the first submission to the last answer, the output
token count of every request, the outputs' texts and the caller process's CPU seconds (so a
client's own cost shows next to its wall time).
"""
from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from bench_structured_decode import SCHEMA

SCHEMA_TEXT = json.dumps(SCHEMA)


@dataclass(frozen=True)
class Workload:
    texts: list[str]  # the prompts as text (server, language)
    ids: list[list[int]]  # the same prompts as token ids (scheduler, Engine)
    budgets: list[int]  # max_new_tokens per request
    constrained: bool  # json_schema (greedy, stops at the value's end) or ignore_eos
    users: list[str] | None = None  # the chat paths' user texts (None: ``texts``)

    def user(self, i: int) -> str:
        return (self.users or self.texts)[i]


@dataclass(frozen=True)
class Run:
    wall: float
    tokens: list[int]  # output tokens per request
    texts: list[str]
    cpu: float  # this process's CPU seconds during the run


def timed(fn: Callable[[], tuple[list[int], list[str]]]) -> Run:
    cpu0, t0 = time.process_time(), time.perf_counter()
    tokens, texts = fn()
    return Run(time.perf_counter() - t0, tokens, texts, time.process_time() - cpu0)


def sampling(w: Workload, i: int) -> dict[str, Any]:
    """Runtime sampling params of request ``i`` (Engine and native requests)."""
    params: dict[str, Any] = {"max_new_tokens": w.budgets[i], "temperature": 0.0}
    if w.constrained:
        params["json_schema"] = SCHEMA_TEXT
    else:
        params["ignore_eos"] = True
    return params


# ---------------------------------------------------------------- (b) the Engine

def engine_run(engine: Any, w: Workload) -> Run:
    engine.flush_cache()

    def go() -> tuple[list[int], list[str]]:
        outs = engine.generate(input_ids=w.ids,
                               sampling_params=[sampling(w, i) for i in range(len(w.ids))])
        return [len(o["output_ids"]) for o in outs], [o["text"] for o in outs]
    return timed(go)


# ---------------------------------------------------------------- (d) the language

def _programs() -> tuple[Any, Any]:
    import sgdsl as sgl

    @sgl.function
    def constrained(s, prompt: str, budget: int):
        s += prompt
        s += sgl.gen("out", max_tokens=budget, json_schema=SCHEMA_TEXT, temperature=0.0)

    @sgl.function
    def free(s, prompt: str, budget: int):
        s += prompt
        s += sgl.gen("out", max_tokens=budget, ignore_eos=True, temperature=0.0)
    return constrained, free


PROGRAMS: list[Any] = []


def language_run(backend: Any, w: Workload) -> Run:
    """``run_batch`` of a ``@function`` with ``gen(json_schema=...)`` (or a free ``gen``)."""
    if not PROGRAMS:
        PROGRAMS.extend(_programs())
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


def aiohttp_transport() -> Any:
    """An httpx transport over aiohttp (None without aiohttp): the official client's own
    requests and parsing, another HTTP stack under them."""
    try:
        import aiohttp
    except ImportError:
        return None
    import httpx

    skip = {"host", "content-length", "transfer-encoding", "connection"}

    class AiohttpTransport(httpx.AsyncBaseTransport):
        def __init__(self) -> None:
            self.session: Any = None

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            if self.session is None:  # made on the running loop
                self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
            headers = {k: v for k, v in request.headers.items() if k.lower() not in skip}
            async with self.session.request(request.method, str(request.url), headers=headers,
                                            data=await request.aread()) as resp:
                body = await resp.read()
                out = [(k, v) for k, v in resp.headers.items()
                       if k.lower() not in skip | {"content-encoding"}]
            return httpx.Response(resp.status, headers=out, content=body, request=request)

        async def aclose(self) -> None:
            if self.session is not None:
                await self.session.close()
    return AiohttpTransport()


def openai_run(url: str, w: Workload, transport: str) -> Run:
    """Chat completions with ``response_format`` json_schema, all requests at once."""
    return timed(lambda: asyncio.run(_openai_batch(url, w, transport)))


async def _openai_batch(url: str, w: Workload, transport: str) -> tuple[list[int], list[str]]:
    import httpx
    import openai

    kw: dict[str, Any] = {}
    if transport == "aiohttp":
        kw["http_client"] = httpx.AsyncClient(transport=aiohttp_transport(), timeout=None)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                                timeout=3600.0, **kw)
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}

    async def one(i: int) -> Any:
        kw = {"response_format": rf} if w.constrained else {"extra_body": {"ignore_eos": True}}
        return await client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": w.user(i)}],
            max_tokens=w.budgets[i], temperature=0.0, **kw)
    try:
        outs = await asyncio.gather(*(one(i) for i in range(len(w.texts))))
    finally:
        await client.close()
    return ([o.usage.completion_tokens for o in outs],
            [o.choices[0].message.content or "" for o in outs])


def raw_run(url: str, w: Workload, route: str) -> Run:
    """The same requests as bare aiohttp JSON posts, no SDK: ``native`` (``/generate``, token
    ids in) or ``chat`` (``/v1/chat/completions``, the openai path's body). Beside ``openai``
    these split a gap into the SDK's cost, the chat route's and every HTTP request's."""
    return timed(lambda: asyncio.run(_raw_batch(url, w, route)))


async def _raw_batch(url: str, w: Workload, route: str) -> tuple[list[int], list[str]]:
    import aiohttp

    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}

    def body(i: int) -> dict[str, Any]:
        if route == "native":
            return {"input_ids": w.ids[i], "sampling_params": sampling(w, i)}
        extra = {"response_format": rf} if w.constrained else {"ignore_eos": True}
        return {"model": "default", "messages": [{"role": "user", "content": w.user(i)}],
                "max_tokens": w.budgets[i], "temperature": 0.0, **extra}

    path = "/generate" if route == "native" else "/v1/chat/completions"
    async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=0)) as session:
        async def one(i: int) -> dict[str, Any]:
            async with session.post(path, json=body(i)) as resp:
                return await resp.json()
        outs = await asyncio.gather(*(one(i) for i in range(len(w.texts))))
    if route == "native":
        return [len(o["output_ids"]) for o in outs], [o["text"] for o in outs]
    return ([o["usage"]["completion_tokens"] for o in outs],
            [o["choices"][0]["message"]["content"] or "" for o in outs])


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
