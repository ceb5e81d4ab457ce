"""The benchmarks' HTTP clients of ``sgdsl serve`` and what they share with the other paths: the
``Workload`` (prompts, per-request budgets, constrained or not), the ``Run`` it gives, the person
schema, the official ``openai`` client (over httpx or an aiohttp transport) and bare aiohttp
posts. No torch here: ``client_pool.py``'s client processes import only this.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

# The 5-field person schema of the structured benchmarks (one file: benchmarks/person_schema.json).
SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "person_schema.json").read_text())
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
    # the scheduler's counters over the run (forward_steps, extend_steps, submit_handoffs),
    # where the path can read them (None: not read)
    steps: dict[str, int] | None = None


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
    return timed(lambda: asyncio.run(openai_batch(url, w, transport)))


async def openai_batch(url: str, w: Workload, transport: str) -> tuple[list[int], list[str]]:
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
    return timed(lambda: asyncio.run(raw_batch(url, w, route)))


async def raw_batch(url: str, w: Workload, route: str) -> tuple[list[int], list[str]]:
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
