"""The server's own CPU per native ``/generate`` request, in-process and without sockets: the app
``sgdsl serve`` builds, behind uvicorn's proxy-headers layer as uvicorn runs it, driven with ASGI
messages, over an engine stand-in that answers at once (issue 29: what the server's loop pays
per request, apart from the model, the scheduler and the network).

Rounds alternate the app as built (``front``: the hot routes before FastAPI's stack) and the same
app with the front off (every request through FastAPI's stack, as before), in one process, so
both see the same load; prints the loop's CPU (``time.thread_time``) per request, median of the
rounds, and the ratio.

    python benchmarks/bench_server_route.py --requests 2000 --rounds 7
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import orjson

VOCAB = 128256
PROMPT = [(i * 7919) % 120000 + 1000 for i in range(290)]


class StubEngine:
    """The Engine surface the routes use; ``generate_nowait`` answers at once with an output
    of the usual shape (96 ids, meta_info)."""

    model_info = {"model_path": "/stub/model", "served_model_name": "stub",
                  "context_length": 4096, "vocab_size": VOCAB, "eos_token_ids": [2],
                  "chat_template": None, "is_generation": True}
    tokenizer = None

    def stats(self) -> dict[str, Any]:
        return {}

    def abort(self, rid: str) -> None:
        pass

    def generate_nowait(self, sampling_params: Any = None, rid: Any = None,
                        input_ids: Any = None, **_: Any) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        fut.set_result({"text": "x" * 300, "output_ids": list(range(96)), "meta_info": {
            "id": rid, "finish_reason": {"type": "length", "length": 96},
            "prompt_tokens": len(input_ids), "completion_tokens": 96, "cached_tokens": 0,
            "e2e_latency": 0.5}})
        return fut


def scope(body: bytes) -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": "/generate", "raw_path": b"/generate",
            "query_string": b"", "root_path": "", "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 30000),
            "headers": [(b"host", b"127.0.0.1:30000"), (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())]}


async def one(app: Any, body: bytes) -> int:
    sent: list[dict[str, Any]] = []
    gone = asyncio.Event()
    first = True

    async def receive() -> dict[str, Any]:
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()  # the client stays: the route's disconnect watch waits here
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
    await app(scope(body), receive, send)
    return sent[0]["status"]


async def run(app: Any, body: bytes, requests: int, burst: int) -> float:
    """Loop CPU ms per request over ``requests`` requests, ``burst`` at a time."""
    t0 = time.thread_time()
    for _ in range(requests // burst):
        codes = await asyncio.gather(*(one(app, body) for _ in range(burst)))
        assert set(codes) == {200}, codes
    return 1e3 * (time.thread_time() - t0) / (requests // burst * burst)


async def main(a: argparse.Namespace) -> None:
    from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

    from sgdsl.runtime.server.app import create_app

    app = create_app(StubEngine())
    front = getattr(app, "front", None)  # None: a tree before the front (one row: "as built")
    served = ProxyHeadersMiddleware(app, trusted_hosts="127.0.0.1")
    body = orjson.dumps({"input_ids": PROMPT, "sampling_params": {
        "max_new_tokens": 96, "temperature": 0.0, "ignore_eos": True}})
    await run(served, body, a.requests // 4, a.burst)  # warm-up
    ms: dict[str, list[float]] = {"front": [], "no front": []} if front else {"as built": []}
    for _ in range(a.rounds):
        for name in ms:
            if front is not None:
                app.front = front if name == "front" else None
            ms[name].append(await run(served, body, a.requests, a.burst))
    med = {k: statistics.median(v) for k, v in ms.items()}
    for k, v in ms.items():
        print(f"{k:9s} loop CPU ms/request: median {med[k]:.4f}  rounds "
              + " ".join(f"{x:.4f}" for x in v))
    if front is not None:
        print(f"front / no front: {med['front'] / med['no front']:.3f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--burst", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=7)
    try:
        import uvloop

        uvloop.install()  # as uvicorn's loop="auto" where uvloop is installed (the GPU host)
    except ImportError:
        pass
    asyncio.run(main(ap.parse_args()))
