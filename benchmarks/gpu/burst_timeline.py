"""Where a burst's wall time goes: one burst of ``--requests`` native ``/generate`` posts (bare
aiohttp) against ``sgdsl serve``'s app, and the same prompts as one ``Engine.generate`` list
call, each stamped at every hop (issue 29 item 1: the server's remaining gap to the Engine).

The Engine and the server (uvicorn in a thread, the very app ``sgdsl serve`` builds) share this
process, so one clock stamps every hop of the main process; the scheduler's stamps are its
``BatchTokenOut.sent_at`` ($SGDSL_HOP_TIMES, wall clock, mapped onto the same clock). Hops, in
ms from the client's first post (server) or the ``generate`` call (Engine), first / last:

- ``client_send`` (the client posts), ``intake`` (the server's protocol accepted a connection
  or read bytes), ``parsed`` (a body validated), ``submit`` (the handler submitted it),
  ``handoff`` (the submitter handed a group to the engine loop; n = its requests),
  ``tm_send`` (the engine loop sent a group to the scheduler),
- ``sched_out`` (the scheduler sent a step's outputs: the first is the first prefill wave's
  end), ``recv`` (the main process received them), ``finished`` (requests finished in them),
- ``settled`` (a result reached the server's loop), ``written`` (its response body was sent),
  ``client_recv`` (the client has it).

``--stages N`` adds N bursts and N lone requests with every request's own stages, arrival
(client -> app -> parsed -> submit -> handoff -> tm_send -> the scheduler handled it) and finish
(the scheduler's output -> recv -> settled -> written -> client), median and max
(``request_stages.py``; the scheduler's side from its step trace), and the CPU per request of the
server loop's thread, the engine loop's thread, the main process and the scheduler.

    python benchmarks/gpu/burst_timeline.py --device cpu --tiny --requests 32 --max-new 16
    python benchmarks/gpu/burst_timeline.py --device cpu --tiny --rounds 0 --lone 0 --stages 5
    source benchmarks/gpu/device_env.sh && python3 benchmarks/gpu/burst_timeline.py \\
        --model-config benchmarks/gpu/configs/llama-3.1-8b --load-format dummy --requests 32
"""
from __future__ import annotations

import os

os.environ.setdefault("SGDSL_HOP_TIMES", "1")  # before the runtime's import: sent_at stamps

import argparse  # noqa: E402
import asyncio  # noqa: E402
import itertools  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_structured_paths as bsp  # noqa: E402
import request_stages  # noqa: E402
from common import device_line  # noqa: E402

EVENTS: list[tuple[float, str, int]] = []
ORDER = ("client_send", "intake", "parsed", "submit", "handoff", "tm_send", "sched_out", "recv",
         "finished", "settled", "written", "client_recv")


def stamp(name: str, n: int = 1, at: float | None = None) -> None:
    EVENTS.append((time.time() if at is None else at, name, n))


def _wrap(owner: Any, attr: str, before: Any = None, after: Any = None) -> None:
    inner = getattr(owner, attr)
    if asyncio.iscoroutinefunction(inner):
        async def wrapped(*args: Any, **kw: Any) -> Any:
            if before:
                before(*args, **kw)
            out = await inner(*args, **kw)
            if after:
                after(out, *args, **kw)
            return out
    else:
        def wrapped(*args: Any, **kw: Any) -> Any:  # type: ignore[misc]
            if before:
                before(*args, **kw)
            out = inner(*args, **kw)
            if after:
                after(out, *args, **kw)
            return out
    setattr(owner, attr, wrapped)


def instrument(engine: Any, stages: bool = False) -> None:
    from sgdsl.runtime import submitter
    from sgdsl.runtime.ipc import messages as m
    from sgdsl.runtime.ipc.channel import AsyncChannel
    from sgdsl.runtime.server import hot_routes
    from sgdsl.runtime.tokenizer.manager import TokenizerManager

    _wrap(submitter.Submitter, "submit", before=lambda *a: stamp("submit"))
    _wrap(submitter.Submitter, "_flush", before=lambda self: stamp(
        "handoff", sum(not f.done() for _, f in self._pending)))
    _wrap(submitter._Slot, "put_nowait", before=lambda *a: stamp("settled"))
    _wrap(TokenizerManager, "submit", before=lambda self, specs, settle: stamp(
        "tm_send", len(specs)))
    _wrap(TokenizerManager, "generate", before=lambda self, specs, *a: stamp(
        "tm_send", len(specs)))
    _wrap(hot_routes, "_validated", after=lambda out, *a: stamp("parsed"))
    _wrap(engine, "note_intake", before=lambda *a: stamp("intake"))
    if stages:
        request_stages.instrument(_wrap)

    def received(msg: Any, *a: Any, **kw: Any) -> None:
        if isinstance(msg, m.BatchTokenOut):
            stamp("recv", len(msg.outs))
            if msg.sent_at is not None:
                stamp("sched_out", len(msg.outs), msg.sent_at)
            done = sum(o.finish_reason is not None for o in msg.outs)
            if done:
                stamp("finished", done)
    _wrap(AsyncChannel, "recv", after=received)

    inner_call = hot_routes.HotRoutes.__call__

    async def call(self: Any, scope: Any, receive: Any, send: Any) -> None:
        box = None
        if scope["type"] == "http" and not scope["path"].startswith("/_"):
            stamp(f"{scope['method']} {scope['path']}")  # every request the server takes
            if stages:
                box = request_stages.app_entered()

        async def stamped(message: Any) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                stamp("written")
                if box is not None:
                    request_stages.written(box)
        await inner_call(self, scope, receive, stamped)
    hot_routes.HotRoutes.__call__ = call


async def post_burst(url: str, bodies: list[dict[str, Any]],
                     times: dict[str, tuple[float, float]] | None = None) -> None:
    """Every body posted at once, each on its own fresh connection: a minimal HTTP/1.1 client
    on asyncio streams (cheap per request, so the server's side shows; no aiohttp needed).
    ``times``: filled with rid -> (posted, answer read) for bodies that carry a rid."""
    import json

    host, port = url.rsplit("/", 1)[-1].split(":")

    async def one(body: dict[str, Any]) -> None:
        stamp("client_send")
        sent = time.time()
        payload = json.dumps(body).encode()
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /generate HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json"
                     b"\r\ncontent-length: %d\r\n\r\n%s" % (host.encode(), len(payload),
                                                             payload))
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"content-length: *(\d+)", head, re.I).group(1))
        await reader.readexactly(length)
        stamp("client_recv")
        if times is not None and "rid" in body:
            times[body["rid"]] = (sent, time.time())
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(head.decode())
        writer.close()
    await asyncio.gather(*(one(b) for b in bodies))


def timeline(title: str, events: list[tuple[float, str, int]], t0: float, t_end: float,
             verbose: bool = True) -> dict[str, tuple[int, float, float]]:
    """Per hop: count, first and last (ms after t0); printed (only the wall unless
    ``verbose``, with the hand-offs)."""
    print(f"\n{title}: wall {1e3 * (t_end - t0):.1f} ms")
    rows: dict[str, tuple[int, float, float]] = {}
    for name in ORDER:
        hits = sorted((t, n) for t, k, n in events if k == name)
        if not hits:
            continue
        rows[name] = (len(hits), 1e3 * (hits[0][0] - t0), 1e3 * (hits[-1][0] - t0))
        sizes = [n for _, n in hits]
        extra = f"  n={sizes}" if name in ("handoff", "tm_send") or (
            name == "sched_out" and len(sizes) <= 12) else ""
        if verbose or name == "handoff":
            print(f"  {name:12s} x{len(hits):4d}  first {rows[name][1]:8.1f}  "
                  f"last {rows[name][2]:8.1f}{extra}", flush=True)
    return rows


def serve(a: argparse.Namespace) -> None:
    """The server process: the Engine, the app ``sgdsl serve`` builds (instrumented) and two
    routes of this benchmark: ``/_events`` (the stamps so far, cleared) and ``/_engine``
    (the same prompts as one ``Engine.generate`` list call, run here, stamped)."""
    import json

    from starlette.responses import JSONResponse

    from sgdsl.runtime import Engine
    from sgdsl.runtime.server.app import create_app
    from sgdsl.runtime.server.thread_server import ThreadServer

    from sgdsl.runtime import hop_times

    engine = Engine(**bsp.engine_kwargs(a))
    app = create_app(engine)
    instrument(engine, a.stages)
    hop_times.watch_gc("server")  # as sgdsl serve: long collections on stderr

    async def events(_: Any) -> JSONResponse:
        out, EVENTS[:] = list(EVENTS), []
        return JSONResponse(out)

    async def engine_call(request: Any) -> JSONResponse:
        body = json.loads(await request.body())
        t0 = time.time()
        await asyncio.to_thread(engine.generate, input_ids=body["input_ids"],
                                sampling_params=body["sampling_params"])
        return JSONResponse([t0, time.time()])

    async def stages(_: Any) -> JSONResponse:
        return JSONResponse(request_stages.take())

    async def cpu(_: Any) -> JSONResponse:
        """CPU seconds so far: the server loop's thread, the engine loop's, this process."""
        async def engine_thread() -> float:
            return time.thread_time()
        engine_cpu = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
            engine_thread(), engine._loop))
        return JSONResponse({"loop": time.thread_time(), "engine": engine_cpu,
                             "process": time.process_time()})

    app.add_route("/_stages", stages, methods=["GET"])
    app.add_route("/_cpu", cpu, methods=["GET"])

    async def flush(_: Any) -> JSONResponse:
        return JSONResponse(await asyncio.to_thread(engine.flush_cache))
    # raw starlette routes: the app's own parsing stays out of it
    app.add_route("/_events", events, methods=["GET"])
    app.add_route("/_engine", engine_call, methods=["POST"])
    app.add_route("/_flush", flush, methods=["POST"])
    server = ThreadServer(app)
    print(server.start(), flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    server.stop()
    engine.shutdown()


def lone(a: argparse.Namespace, http: Any, url: str, ids: list[int], fetched: Any) -> None:
    """One request at a time (max_new_tokens 1): through the server by httpx (as
    bench_http_burst.py's lone rows) and by the raw client, and through the Engine."""
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
    walls: dict[str, list[float]] = {"httpx": [], "raw": [], "engine": []}
    for i in range(a.lone):
        for client in walls:
            fetched()
            t0 = time.time()
            if client == "httpx":
                http.post("/generate", json=body).raise_for_status()
            elif client == "raw":
                asyncio.run(post_burst(url, [body]))
            else:
                t0, t1 = http.post("/_engine", json={"input_ids": [ids], "sampling_params": [
                    body["sampling_params"]]}).json()
            t1 = time.time() if client != "engine" else t1
            walls[client].append(t1 - t0)
            if i == a.lone - 1:
                timeline(f"lone request, {client}", EVENTS + fetched(), t0, t1)
            EVENTS.clear()
    print("\nlone median ms: " + ", ".join(
        f"{k} {1e3 * statistics.median(v):.2f}" for k, v in walls.items()))


def lang_rounds(a: argparse.Namespace, child: "Child", texts: list[str]) -> None:
    """``run_batch`` of the person programs on ``RuntimeEndpoint`` (as bench_structured_paths'
    lang-endpoint rows), each round split into: the client before the server took the
    request, the server until it sent the request(s) on to the scheduler, the scheduler (hand-off to its last output), the
    server's answer (last output to response written), the client after."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from person_programs import person_programs

    from sgdsl.backends import RuntimeEndpoint

    endpoint = RuntimeEndpoint(child.url)
    batch = [{"prompt": t, "budget": a.max_new} for t in texts]
    for constrained, program in zip((True, False), person_programs()):
        spans: dict[str, list[float]] = {}
        for r in range(a.lang + 1):  # the first is a warm-up
            child.http.post("/_flush")
            child.fetched()
            t0 = time.time()
            states = program.run_batch(batch, backend=endpoint)
            t1 = time.time()
            assert all(st.error() is None for st in states)
            ev = child.fetched()
            first = {k: min(t for t, kk, _ in ev if kk == k) for k in ("POST /generate",
                                                                      "tm_send")}
            last = {k: max(t for t, kk, _ in ev if kk == k) for k in ("sched_out", "written")}
            parts = {"client before": first["POST /generate"] - t0,
                     "server to scheduler": first["tm_send"] - first["POST /generate"],
                     "scheduler": last["sched_out"] - first["tm_send"],
                     "server answer": last["written"] - last["sched_out"],
                     "client after": t1 - last["written"], "wall": t1 - t0}
            for k, v in parts.items():
                if r:
                    spans.setdefault(k, []).append(v)
        print(f"lang-endpoint batch {len(batch)} {'constrained' if constrained else 'free'}, "
              f"median ms of {a.lang}: " + ", ".join(
                  f"{k} {1e3 * statistics.median(v):.1f}" for k, v in spans.items()),
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-config", default=str(bsp.CONFIGS / "llama-3.1-8b"))
    ap.add_argument("--load-format", default="dummy")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--max-new", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lone", type=int, default=3,
                    help="lone requests (max_new_tokens 1, the same prompt: cached after the "
                         "first) per client, timelines of the last")
    ap.add_argument("--lang", type=int, default=0,
                    help="also N rounds of run_batch (the person programs, constrained and "
                         "free) on RuntimeEndpoint at batch --requests, split by hop")
    ap.add_argument("--python", action="append", default=[], metavar="NAME=PATH",
                    help="also a server run by another interpreter (another tree's venv), "
                         "rounds interleaved")
    ap.add_argument("--stages", type=int, default=0,
                    help="also N bursts and N lone requests (max_new_tokens 1) with every "
                         "request's stages (request_stages.py) and the CPU per request")
    ap.add_argument("--json", action="store_true",
                    help="the --stages requests constrained by the person schema")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.batches, a.grammar_backend, a.chat_matched = [a.requests], "xgrammar", True
    a.disable_jump_forward, a.jump_max_batch, a.disable_request_coalescing = False, None, False
    if a.serve:
        return serve(a)
    from sgdsl.runtime.config import EngineConfig
    from sgdsl.runtime.tokenizer.loader import load_tokenizer

    kw = bsp.engine_kwargs(a)
    texts, ids, _ = bsp.prompts(load_tokenizer(EngineConfig(**kw), kw["model"]), a,
                                a.requests)
    print(device_line(), flush=True)
    pythons = {"this": sys.executable, **dict(p.split("=", 1) for p in a.python)}
    argv = [x for i, x in enumerate(sys.argv[1:]) if x != "--python"
            and (i == 0 or sys.argv[i] != "--python")]
    traces = ({name: tempfile.mkdtemp(prefix=f"stages-{name}-") for name in pythons}
              if a.stages else {})
    servers = {name: Child(python, argv, traces.get(name)) for name, python in pythons.items()}
    wave = max(1, kw["chunked_prefill_size"] // max(1, len(ids[0])))
    for child in servers.values():
        child.wave = min(wave, len(ids))  # the first prefill wave's requests: when they went
    try:
        for r in range(a.rounds):
            for name, child in servers.items():
                child.round(a, ids, f"{name} round {r}", verbose=r == a.rounds - 1)
        stage_rounds(a, servers, ids)
        for name, child in servers.items():
            if a.lang:
                print(f"\n--- {name}: run_batch on RuntimeEndpoint", flush=True)
                lang_rounds(a, child, texts)
        for name, child in servers.items():
            if a.lone:
                print(f"\n--- {name}: lone requests", flush=True)
                lone(a, child.http, child.url, ids[0], child.fetched)
        for name, child in servers.items():
            print(f"\n{name}: " + "; ".join(
                f"{k} {1e3 * statistics.median(v):.{3 if 'cpu' in k else 1}f}"
                for k, v in child.summary.items()))
            ratios = [s / e for s, e in zip(child.summary.get("server wall", []),
                                            child.summary.get("engine wall", []))]
            if not ratios:
                continue
            print(f"{name}: server/Engine wall per round (back to back, same load): "
                  + ", ".join(f"{r:.2f}" for r in ratios)
                  + f"; median {statistics.median(ratios):.2f}")
    finally:
        for child in servers.values():
            child.close()
        for folder in traces.values():
            shutil.rmtree(folder, ignore_errors=True)


def stage_rounds(a: argparse.Namespace, servers: dict[str, "Child"], ids: list[list[int]]) -> None:
    """``--stages``: bursts of every prompt, then lone requests, each request's stages."""
    if not a.stages:
        return
    params: dict[str, Any] = {"max_new_tokens": a.max_new, "temperature": 0.0,
                              "ignore_eos": True}
    if a.json:
        params = {"max_new_tokens": a.max_new, "temperature": 0.0,
                  "json_schema": bsp.sp.SCHEMA_TEXT}
    bodies = [{"input_ids": x, "sampling_params": params} for x in ids]
    lone = [{"input_ids": ids[0], "sampling_params": dict(params, max_new_tokens=1)}]
    for child in servers.values():  # warm-up (the schema's compile, first-touch costs)
        asyncio.run(post_burst(child.url, bodies))
    for r in range(a.stages):
        for name, child in servers.items():
            child.stage_round(a, bodies, f"{name} stages burst {r}")
    for r in range(a.stages):
        for name, child in servers.items():
            child.stage_round(a, lone, f"{name} stages lone {r}")


class Child:
    """A server process (this script's ``--serve``) run by ``python``."""

    def __init__(self, python: str, argv: list[str], trace: str | None = None) -> None:
        import subprocess

        import httpx

        env = dict(os.environ, **({"SGDSL_STEP_TRACE": trace} if trace else {}))
        self.trace = trace  # the scheduler's step trace folder (--stages)
        self.proc = subprocess.Popen([python, __file__, *argv, "--serve"], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.url = self.proc.stdout.readline().strip()
        self.http = httpx.Client(base_url=self.url, timeout=600)
        self.summary: dict[str, list[float]] = {}
        self.wave = 0  # requests in the first prefill wave (set by the caller)

    def fetched(self) -> list[tuple[float, str, int]]:
        got = self.http.get("/_events")
        got.raise_for_status()
        return [tuple(e) for e in got.json()]

    def steps(self) -> dict[str, int]:
        info = self.http.get("/get_server_info").json()
        return {k: int(info.get(k, 0)) for k in ("extend_steps", "forward_steps")}

    def cpu(self) -> dict[str, float]:
        from proc_stats import cpu_seconds, descendants

        out = self.http.get("/_cpu").json()
        out["scheduler"] = sum(map(cpu_seconds, descendants(self.proc.pid)))
        return out

    def stage_round(self, a: argparse.Namespace, bodies: list[dict[str, Any]],
                    title: str) -> None:
        """One burst of ``bodies`` (each given a rid) with every request's stages printed."""
        bodies = [dict(b, rid=f"{title.replace(' ', '-')}-{i}") for i, b in enumerate(bodies)]
        self.http.post("/_flush")
        self.http.get("/_stages")
        times: dict[str, tuple[float, float]] = {}
        idle = self.cpu()
        t0, c0 = time.time(), self.cpu()
        asyncio.run(post_burst(self.url, bodies, times))
        c1 = self.cpu()
        c1 = {k: v - (c0[k] - idle[k]) for k, v in c1.items()}  # less a /_cpu call's own
        time.sleep(1.1)  # the step trace flushes its rows with a row a second after the last
        self.http.post("/_flush")  # a message: the scheduler writes a row (and flushes)
        handled = request_stages.scheduler_handled(self.trace, t0) if self.trace else []
        spans = request_stages.report(title, self.http.get("/_stages").json(), times, handled)
        n = len(bodies)
        kind = "lone" if n == 1 else f"burst {n}"
        cpu = {k: 1e3 * (c1[k] - c0[k]) / n for k in c1}
        print("  CPU ms/request: " + ", ".join(f"{k} {v:.3f}" for k, v in cpu.items()))
        for k, v in cpu.items():
            self.note(f"{kind} cpu {k} ms/req", v / 1e3)
        for k in ("ARRIVAL", "FINISH"):
            if spans.get(k):
                self.note(f"{kind} max {k}", max(spans[k]) / 1e3)
                self.note(f"{kind} median {k}", statistics.median(spans[k]) / 1e3)

    def note(self, key: str, value: float) -> None:
        self.summary.setdefault(key, []).append(value)

    def round(self, a: argparse.Namespace, ids: list[list[int]], title: str,
              verbose: bool) -> None:
        params = {"max_new_tokens": a.max_new, "temperature": 0.0, "ignore_eos": True}
        bodies = [{"input_ids": x, "sampling_params": params} for x in ids]
        if not self.summary:  # warm-up: a burst of the same size (first-touch costs)
            asyncio.run(post_burst(self.url, bodies))
            self.http.post("/_engine", json={"input_ids": ids,
                                              "sampling_params": [params] * len(ids)})
        self.http.post("/_flush")
        self.fetched()
        s0 = self.steps()
        t0 = time.time()
        asyncio.run(post_burst(self.url, bodies))
        t1 = time.time()
        s1 = self.steps()
        print(f"{title}: server burst steps " + ", ".join(f"{k} {s1[k] - s0[k]}" for k in s1))
        events = self.fetched()
        rows = timeline(f"{title}: server burst of {a.requests}", EVENTS + events, t0, t1,
                        verbose)
        EVENTS.clear()
        handed = sorted((t, n) for t, k, n in EVENTS + events if k == "handoff")
        cumulative = itertools.accumulate(n for _, n in handed)
        wave = next((t for (t, _), c in zip(handed, cumulative) if c >= self.wave), handed[-1][0])
        self.note(f"server {self.wave} handed off", wave - t0)
        self.note("server wall", t1 - t0)
        self.note("server first tm_send", rows["tm_send"][1] / 1e3)
        self.note("server last parsed", rows["parsed"][2] / 1e3)
        self.note("server last sched_out->client_recv",
                  (rows["client_recv"][2] - rows["sched_out"][2]) / 1e3)
        self.http.post("/_flush")
        s0 = self.steps()
        t0, t1 = self.http.post("/_engine", json={
            "input_ids": ids, "sampling_params": [params] * len(ids)}).json()
        s1 = self.steps()
        print(f"{title}: Engine steps " + ", ".join(f"{k} {s1[k] - s0[k]}" for k in s1))
        rows = timeline(f"{title}: Engine list call of {a.requests} (in the server process)",
                        self.fetched(), t0, t1, verbose)
        self.note("engine wall", t1 - t0)
        self.note("engine first tm_send", rows["tm_send"][1] / 1e3)

    def close(self) -> None:
        self.http.close()
        self.proc.stdin.close()
        self.proc.wait(120)


if __name__ == "__main__":
    main()
