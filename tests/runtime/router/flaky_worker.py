"""A scripted worker for router tests: answers /generate, /v1/messages and /health the way a
server does, or fails on cue (503, a connection dropped before or in the middle of a stream,
a hang, a failing health check)."""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse


class Drop(Exception):
    """Raised inside a handler: uvicorn drops the connection (no complete response)."""


@dataclass
class Script:
    mode: str = "ok"  # ok | 503 | drop | die_mid_stream | hang | stall_mid_stream
    healthy: bool = True
    name: str = "w"
    seen: list[dict] = field(default_factory=list)  # bodies of the requests served
    flushed: int = 0
    precompile_fails: tuple[int, ...] = ()  # indexes of the constraints this worker rejects


def _events(name: str, n: int) -> list[bytes]:
    return [f"data: {json.dumps({'text': name * (i + 1), 'index': i})}\n\n".encode()
            for i in range(n)]


def make_app(script: Script) -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    async def health() -> Response:
        return PlainTextResponse("OK") if script.healthy else Response(status_code=503)

    @app.get("/get_model_info")
    async def model_info() -> dict:
        return {"model_path": "/flaky", "served_model_name": script.name}

    @app.post("/flush_cache")
    async def flush() -> Response:
        script.flushed += 1
        return PlainTextResponse("Cache flushed.")

    @app.post("/precompile")
    async def precompile(request: Request) -> Response:
        constraints = (await request.json())["constraints"]
        script.seen.append({"precompile": constraints})
        return JSONResponse({"results": [
            {"ok": False, "kind": "regex", "error": f"{script.name} rejects it", "field": "regex",
             "status": 400} if i in script.precompile_fails else {"ok": True, "kind": "regex"}
            for i in range(len(constraints))]})

    @app.post("/generate")
    @app.post("/v1/messages")
    async def generate(request: Request) -> Response:
        body = await request.json()
        if script.mode == "503":
            return JSONResponse({"error": {"message": "overloaded"}}, status_code=503)
        if script.mode == "drop":  # headers out, then the connection goes before any body
            kind = "text/event-stream" if body.get("stream") else "application/json"
            return StreamingResponse(_stream([], die_at=0), media_type=kind)
        while script.mode == "hang":  # until the test lets go (so the server can stop)
            await asyncio.sleep(0.05)
        script.seen.append(body)
        if not body.get("stream"):
            return JSONResponse({"text": script.name, "meta_info": {"worker": script.name}})
        events = _events(script.name, 4)
        die_at = 2 if script.mode == "die_mid_stream" else -1
        if script.mode == "stall_mid_stream":
            return StreamingResponse(_stall(events[:2], script), media_type="text/event-stream")
        return StreamingResponse(_stream(events, die_at),
                                 media_type="text/event-stream")

    return app


async def _stream(events: list[bytes], die_at: int):
    if die_at == 0:
        raise Drop()
    for i, event in enumerate(events):
        if i == die_at:
            yield event[:10]  # half an event, then the connection goes
            raise Drop()
        yield event
        await asyncio.sleep(0.01)
    yield b"data: [DONE]\n\n"


async def _stall(events: list[bytes], script: Script):
    for event in events:
        yield event
    while script.mode == "stall_mid_stream":
        await asyncio.sleep(0.05)
