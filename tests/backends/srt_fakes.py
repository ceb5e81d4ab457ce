"""A deterministic fake of the runtime's SGLang-native generate API, shared by the unit tests
of Local (``FakeEngine``) and RuntimeEndpoint (``make_endpoint``: an httpx MockTransport).

Tokens are characters, except that "ab" merges into one token: so a context ending in "a"
followed by a choice starting with "b" tokenizes differently at the boundary."""
from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from sgdsl.backends.runtime_endpoint import RuntimeEndpoint
from sgdsl.runtime.errors import InvalidRequestError

MERGE = "ab"
EOS = 2


def tokenize(text: str) -> list[int]:
    ids, i = [], 0
    while i < len(text):
        if text.startswith(MERGE, i):
            ids.append(1000)
            i += 2
        else:
            ids.append(ord(text[i]))
            i += 1
    return ids


def logprob(pos: int, tid: int) -> float:
    """A fixed, position-dependent logprob (what the model "thinks")."""
    return -((tid % 7) + 1) / 10 - pos / 1000


class FakeRuntime:
    """Records requests; answers them like the runtime would."""

    model_info = {"model_path": "/models/fake", "served_model_name": "fake",
                  "context_length": 2048, "vocab_size": 2000, "eos_token_ids": [EOS],
                  "chat_template": None, "is_generation": True}

    def __init__(self, grammar_backend: str = "xgrammar") -> None:
        self.requests: list[dict[str, Any]] = []
        self.aborted: list[str] = []
        self.grammar_backend = grammar_backend

    def server_info(self) -> dict[str, Any]:
        return {"grammar_backend": self.grammar_backend, "model": None}

    def generate(self, req: dict[str, Any]) -> dict | list:
        self.requests.append(req)
        prompts = req.get("text", req.get("input_ids"))
        batch = isinstance(prompts, list) and prompts and not isinstance(prompts[0], int)
        items = prompts if batch else [prompts]
        rids = req.get("rid") if batch else [req.get("rid")]
        sps = req.get("sampling_params", {})
        sps = sps if isinstance(sps, list) else [sps] * len(items)
        outs = [self._one(p, req, rids[i] if rids else None, sps[i]) for i, p in enumerate(items)]
        flat = [o for group in outs for o in group]
        return flat if batch or sps[0].get("n", 1) > 1 else flat[0]

    def _one(self, prompt: Any, req: dict, rid: Any, sp: dict | None = None) -> list[dict]:
        ids = tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        sp = req.get("sampling_params", {}) if sp is None else sp
        max_new = sp.get("max_new_tokens", 128)
        outs = []
        for k in range(sp.get("n", 1)):
            text = ("xy" * max_new)[:max_new] if k == 0 else ("yx" * max_new)[:max_new]
            meta = {"id": rid, "prompt_tokens": len(ids), "completion_tokens": max_new,
                    "cached_tokens": 0, "finish_reason": {"type": "length", "length": max_new}}
            if req.get("return_logprob"):
                start = max(req.get("logprob_start_len", -1), 0)
                meta["input_token_logprobs"] = [
                    [None if p == 0 else logprob(p, t), t, None] for p, t in enumerate(ids)][start:]
            outs.append({"text": text, "output_ids": [ord(c) for c in text], "meta_info": meta})
        return outs

    def stream(self, req: dict[str, Any]) -> list[dict]:
        """The chunks of a streamed request (cumulative text, as the runtime sends them)."""
        self.requests.append(req)
        full = self._one(req["text"], req, req.get("rid"))[0]
        chunks = []
        for i in range(1, len(full["text"]) + 1):
            meta = dict(full["meta_info"], finish_reason=None, completion_tokens=i)
            chunks.append({"text": full["text"][:i], "meta_info": meta})
        if chunks:
            chunks[-1]["meta_info"] = full["meta_info"]
        return chunks


class FakeEngine:
    """The slice of ``sgdsl.runtime.Engine`` that Local uses."""

    def __init__(self, runtime: FakeRuntime, hang_stream: bool = False) -> None:
        self.runtime = runtime
        self.model_info = runtime.model_info
        self.hang_stream = hang_stream
        self.error: Exception | None = None

    def server_info(self) -> dict[str, Any]:
        return self.runtime.server_info()

    def flush_cache(self) -> bool:
        return True

    def abort(self, rid: str) -> None:
        self.runtime.aborted.append(rid)

    async def async_generate(self, prompt: Any = None, stream: bool = False, **kw: Any) -> Any:
        if self.error is not None:
            raise self.error
        req = {k: v for k, v in kw.items() if v is not None}
        if prompt is not None:
            req["text"] = prompt
        if stream:
            req["stream"] = True
            return self._stream(req)
        return self.runtime.generate(req)

    async def _stream(self, req: dict) -> Any:
        for chunk in self.runtime.stream(req):
            yield chunk
            if self.hang_stream:
                await asyncio.sleep(3600)


def sse_body(chunks: list[dict]) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def make_endpoint(runtime: FakeRuntime, hang_stream: bool = False,
                  status: int = 200, error: dict | None = None) -> RuntimeEndpoint:
    def sync_handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/get_model_info":
            return httpx.Response(200, json=runtime.model_info)
        if request.url.path == "/get_server_info":
            return httpx.Response(200, json=runtime.server_info())
        if request.url.path == "/flush_cache":
            return httpx.Response(200)
        return httpx.Response(404)

    async def slow_stream(chunks: list[dict]) -> Any:
        yield b"data: " + json.dumps(chunks[0]).encode() + b"\n\n"
        await asyncio.sleep(3600)

    async def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content or b"{}")
        if request.url.path == "/abort_request":
            runtime.aborted.append(body["rid"])
            return httpx.Response(200)
        if error is not None:
            return httpx.Response(status, json=error)
        if body.get("stream"):
            chunks = runtime.stream(body)
            if hang_stream:
                return httpx.Response(200, content=slow_stream(chunks))
            return httpx.Response(200, content=sse_body(chunks))
        try:
            out = runtime.generate(body)
        except InvalidRequestError as exc:  # answered as the server answers a refused request
            return httpx.Response(400, json={"error": {"message": str(exc), "code": 400}})
        return httpx.Response(200, json=out)

    return RuntimeEndpoint("http://fake:30000", transport=httpx.MockTransport(handler),
                           sync_transport=httpx.MockTransport(sync_handler))
