"""Structured generation on every path a user takes, in one run (issue 29's acceptance table).

Batch 1/32/256, JSON-constrained (the 5-field person schema of ``bench_structured_decode.py``,
greedy, max_new_tokens 96) vs unconstrained at matched output lengths (ignore_eos, each request
given the length it had constrained on the same path), through:

- ``sched``: the in-process scheduler, built as the engine's scheduler process builds it,
  stepped by ``bench_structured_decode.run_mode`` (in a child process, so its GPU memory is
  given back before the next path loads the model);
- ``engine``: ``Engine.generate`` of the batch (token ids in);
- ``openai``: ``sgdsl serve`` (a subprocess on loopback) with the official ``openai`` client,
  ``chat.completions`` with ``response_format`` json_schema, concurrency = batch; and
  ``openai-aiohttp``: the same client over an aiohttp transport (client cost vs server cost);
  ``chat-raw`` / ``native-raw``: bare aiohttp posts, no SDK, to ``/v1/chat/completions`` (the
  same body) and to native ``/generate`` (token ids): the SDK's, the chat route's and every
  HTTP request's share of a gap (``--chat-matched`` gives every other path the chat-rendered
  prompt, so all prefill the same tokens; without it the chat paths prefill ~11% more);
  each of these four with ``-mp`` (``openai-mp``...): the same requests, the same total
  concurrency, spread over ``--client-procs`` client processes (``client_pool.py``): what the
  server sustains, beside what one Python client process can drive;
- ``lang-local`` / ``lang-endpoint``: ``run_batch`` of a ``@function`` with
  ``gen(json_schema=...)`` on ``Local`` (the same Engine) and on ``RuntimeEndpoint`` (the
  same server).

Three model loads (scheduler, Engine, server), all with the same engine options. Prints tokens/s
per path and batch, each path's ratio to ``sched`` and constrained/unconstrained ratios, and
``client cpu`` (this process's CPU seconds in the run: a client's own cost).

    source benchmarks/gpu/device_env.sh && python3 benchmarks/gpu/bench_structured_paths.py \\
        --model-config benchmarks/gpu/configs/llama-3.1-8b --load-format dummy
    python benchmarks/gpu/bench_structured_paths.py --device cpu --tiny --batches 1 8 32 \\
        --prompt-len 32 --max-new 48                     # a CPU smoke run
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (CONFIGS, device_line, print_table, random_prompts,  # noqa: E402
                    tiny_model_dir)
import structured_paths as sp  # noqa: E402
from client_pool import ClientPool  # noqa: E402

HTTP = ("openai", "openai-aiohttp", "chat-raw", "native-raw")
# "-mp": the same requests from --client-procs client processes (client_pool.py)
PATHS = ("sched", "engine", *HTTP, *(f"{p}-mp" for p in HTTP), "lang-local", "lang-endpoint")
SERVED = {*HTTP, *(f"{p}-mp" for p in HTTP), "lang-endpoint"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-config", default=str(CONFIGS / "llama-3.1-8b"))
    ap.add_argument("--load-format", default="dummy")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--tiny", action="store_true",
                    help="the config at 2 layers, hidden 64 (its tokenizer and vocab kept)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32, 256])
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--paths", nargs="+", choices=PATHS,
                    default=[p for p in PATHS if not p.endswith("-mp")])  # -mp rows: asked for
    ap.add_argument("--grammar-backend", default="xgrammar")
    ap.add_argument("--disable-jump-forward", action="store_true")
    ap.add_argument("--jump-max-batch", type=int, default=None,
                    help="grammar_jump_max_batch: jump forward only while at most N requests "
                         "decode (default: always)")
    ap.add_argument("--repeat", type=int, default=1, help="timed rounds per row (median)")
    ap.add_argument("--disable-request-coalescing", action="store_true",
                    help="each single request to the scheduler on its own (runtime/submitter.py "
                         "off): the HTTP paths as before coalescing, for an A/B")
    ap.add_argument("--client-procs", type=int, default=4,
                    help="client processes of the -mp paths (the batch split among them)")
    ap.add_argument("--warmup-tokens", type=int, default=16)
    ap.add_argument("--chat-matched", action="store_true",
                    help="every non-chat path gets the chat-rendered prompt (the model's template "
                         "around the same user text), so all paths prefill the same tokens")
    ap.add_argument("--sched-worker", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def model_dir(a: argparse.Namespace) -> str:
    """The model config dir; with --tiny a copy of its config at a tiny size, same tokenizer."""
    return tiny_model_dir(a.model_config) if a.tiny else a.model_config


def engine_kwargs(a: argparse.Namespace) -> dict[str, Any]:
    """One set of engine options for every path (the scheduler's config, the Engine, serve)."""
    max_bs = max(a.batches)
    kw: dict[str, Any] = dict(model=model_dir(a), load_format=a.load_format, device=a.device,
                              context_length=a.prompt_len + a.max_new + 256,
                              max_running_requests=max_bs, chunked_prefill_size=8192,
                              grammar_backend=a.grammar_backend,
                              disable_jump_forward=a.disable_jump_forward,
                              grammar_jump_max_batch=a.jump_max_batch,
                              disable_request_coalescing=a.disable_request_coalescing)
    if a.device != "cpu":
        kw["cuda_graph_max_bs"] = max_bs
    return kw


def prompts(tokenizer: Any, a: argparse.Namespace, bs: int
            ) -> tuple[list[str], list[list[int]], list[str]]:
    """Seeded random text (ids below the stand-in tokenizer's vocab, decoded), its ids, and the
    chat paths' user texts. With --chat-matched the text and ids are the chat-rendered prompt
    (as the server renders it: the template adds a system turn and role markers, ~30 tokens)."""
    users = [tokenizer.decode(p) for p in random_prompts(bs, a.prompt_len, seed=bs)]
    texts = users
    if a.chat_matched:
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": u}], tokenize=False,
                                               add_generation_prompt=True) for u in users]
    return texts, [tokenizer.encode(t, add_special_tokens=False) for t in texts], users


def measure(run: Any, texts: list[str], ids: list[list[int]], a: argparse.Namespace,
            users: list[str] | None = None, stats: Any = None) -> dict[str, list[sp.Run]]:
    """Warm-up, then ``repeat`` rounds of constrained then unconstrained at its lengths.
    ``stats()``: the engine's counters (``Engine.stats`` or the server's info), read around
    each run into ``Run.steps``."""
    n = len(texts)
    if stats is not None:
        run = _counted(run, stats)
    for constrained in (True, False):
        run(sp.Workload(texts, ids, [a.warmup_tokens] * n, constrained, users))
    runs: dict[str, list[sp.Run]] = {"constrained": [], "free": []}
    for _ in range(a.repeat):
        c = run(sp.Workload(texts, ids, [a.max_new] * n, True, users))
        lengths = [max(1, t) for t in c.tokens]
        runs["constrained"].append(c)
        runs["free"].append(run(sp.Workload(texts, ids, lengths, False, users)))
    return runs


STEP_KEYS = ("forward_steps", "extend_steps", "submit_handoffs", "grammar_jump_forward_tokens",
             "grammar_sampled_tokens", "grammar_compiles")


def _counted(run: Any, stats: Any) -> Any:
    """``run`` with the scheduler's counters over each call in ``Run.steps``: whether a slow
    row did more forward steps (the batch split, a jump-forward lost) or slower ones."""
    import dataclasses

    def go(w: sp.Workload) -> sp.Run:
        before = stats()
        r = run(w)
        after = stats()
        return dataclasses.replace(r, steps={**(r.steps or {}), **{
            k: int(after.get(k, 0)) - int(before.get(k, 0)) for k in STEP_KEYS}})
    return go


def _server_stats(server: sp.Server) -> dict[str, Any]:
    import httpx

    return httpx.get(server.url + "/get_server_info", timeout=60).json()


def summary(runs: list[sp.Run]) -> dict[str, Any]:
    mid = sorted(runs, key=lambda r: r.wall)[len(runs) // 2]
    tokens = sum(mid.tokens)
    return {"wall": mid.wall, "tokens": tokens, "tok_s": tokens / mid.wall, "cpu": mid.cpu,
            "valid": sp.valid_count(mid.texts), "n": len(mid.tokens),
            "walls": [round(r.wall, 3) for r in runs], "steps": mid.steps}


def report(path: str, bs: int, runs: dict[str, list[sp.Run]], results: dict) -> None:
    for mode, rs in runs.items():
        results[path, bs, mode] = s = summary(rs)
        print(f"{path} bs={bs} {mode}: {json.dumps(s)}", flush=True)


# ---------------------------------------------------------------- the paths

def sched_worker(a: argparse.Namespace) -> None:
    """(a), in this (child) process: the engine's own scheduler, stepped by run_mode; prints
    one ``RESULT`` JSON line per batch."""
    import gc

    import bench_structured_decode as bsd
    from sgdsl.runtime.config import EngineConfig
    from sgdsl.runtime.scheduler import process

    sched, _ = process._build(EngineConfig(**engine_kwargs(a)), lambda msg: None)
    from sgdsl.runtime.tokenizer.loader import load_tokenizer

    tok = load_tokenizer(EngineConfig(**engine_kwargs(a)), engine_kwargs(a)["model"])
    gc.collect()
    gc.freeze()  # as the scheduler process does after startup
    sys.setswitchinterval(process.SWITCH_INTERVAL_S)

    def counters() -> dict[str, int]:
        return {**sched.counters, **(sched.grammar.stats_dict() if sched.grammar else {})}

    def run(w: sp.Workload) -> sp.Run:
        sched.memory.flush()
        before = counters()
        res = bsd.run_mode(sched, w.ids, w.constrained, max(w.budgets),
                           None if w.constrained else w.budgets)
        outs = [res["by_rid"][f"r{i}"]["output_ids"] for i in range(len(w.ids))]
        after = counters()
        steps = {k: after.get(k, 0) - before.get(k, 0) for k in STEP_KEYS}
        return sp.Run(res["wall"], [len(o) for o in outs],
                      [tok.decode(o, skip_special_tokens=True) for o in outs], 0.0, steps)
    for bs in a.batches:
        texts, ids, _ = prompts(tok, a, bs)
        runs = measure(run, texts, ids, a)
        print("RESULT " + json.dumps({"bs": bs, "runs": {
            mode: [r.__dict__ for r in rs] for mode, rs in runs.items()}}), flush=True)
    if sched.grammar is not None:
        sched.grammar.shutdown()


def run_sched(a: argparse.Namespace, argv: list[str], results: dict) -> None:
    import subprocess

    cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--sched-worker"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("RESULT "):
            got = json.loads(line[7:])
            report("sched", got["bs"], {m: [sp.Run(**r) for r in rs]
                                        for m, rs in got["runs"].items()}, results)
        else:
            print(line, end="", flush=True)
    if proc.wait() != 0:
        print(f"sched worker failed (exit {proc.returncode})", flush=True)


def run_engine(a: argparse.Namespace, results: dict) -> None:
    """(b) and (d) on Local: one Engine."""
    from sgdsl.runtime import Engine

    with Engine(**engine_kwargs(a)) as engine:
        local = None
        if "lang-local" in a.paths:
            from sgdsl.backends import Local

            local = Local(engine=engine)
        for bs in a.batches:
            texts, ids, _ = prompts(engine.tokenizer, a, bs)
            if "engine" in a.paths:
                report("engine", bs, measure(lambda w: sp.engine_run(engine, w), texts, ids, a,
                                             stats=engine.stats), results)
            if local is not None:
                run = _engine_span(engine, lambda w: sp.language_run(local, w))
                report("lang-local", bs, measure(run, texts, ids, a, stats=engine.stats),
                       results)


def _engine_span(engine: Any, run: Any) -> Any:
    """``run`` with ``Run.steps["engine_span_ms"]``: from the first ``async_generate`` call
    to the last one's return (Local's only way in), so a row's wall splits into the Engine's
    part and the language's own (before the first call, after the last answer)."""
    import dataclasses
    import time

    inner, spans = engine.async_generate, []

    async def timed_call(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return await inner(*args, **kwargs)
        finally:
            spans.append((t0, time.perf_counter()))
    engine.async_generate = timed_call

    def go(w: sp.Workload) -> sp.Run:
        spans.clear()
        r = run(w)
        span = max(e for _, e in spans) - min(b for b, _ in spans) if spans else 0.0
        return dataclasses.replace(r, steps={**(r.steps or {}),
                                             "engine_span_ms": round(1e3 * span)})
    return go


def run_server(a: argparse.Namespace, results: dict) -> None:
    """(c) and (d) on RuntimeEndpoint: one ``sgdsl serve``."""
    from sgdsl.runtime.config import EngineConfig
    from sgdsl.runtime.tokenizer.loader import load_tokenizer

    kw = engine_kwargs(a)
    tok = load_tokenizer(EngineConfig(**kw), kw["model"])
    server = sp.Server(["--model", kw.pop("model"), *sp.server_flags(kw)])
    pool = None
    try:
        endpoint = None
        if "lang-endpoint" in a.paths:
            from sgdsl.backends import RuntimeEndpoint

            endpoint = RuntimeEndpoint(server.url)
        stats = lambda: _server_stats(server)  # noqa: E731
        for bs in a.batches:
            texts, ids, users = prompts(tok, a, bs)
            for transport in ("httpx", "aiohttp"):
                path = "openai" if transport == "httpx" else "openai-aiohttp"
                if path not in a.paths or (transport == "aiohttp" and not sp.aiohttp_transport()):
                    continue
                report(path, bs, measure(lambda w: _served(server, w, transport), texts, ids, a,
                                         users, stats), results)
            for route in ("chat", "native"):
                if f"{route}-raw" in a.paths and sp.aiohttp_transport():
                    report(f"{route}-raw", bs, measure(
                        lambda w: _raw(server, w, route), texts, ids, a, users, stats), results)
            for path in (p for p in HTTP if f"{p}-mp" in a.paths
                         and (p == "openai" or sp.aiohttp_transport())):
                pool = pool or ClientPool(a.client_procs)
                report(f"{path}-mp", bs, measure(lambda w: _pooled(server, pool, path, w), texts,
                                                 ids, a, users, stats), results)
            if endpoint is not None:
                report("lang-endpoint", bs, measure(lambda w: sp.language_run(endpoint, w),
                                                    texts, ids, a, stats=stats), results)
    finally:
        if pool is not None:
            pool.close()
        server.stop()


def _served(server: sp.Server, w: sp.Workload, transport: str) -> sp.Run:
    server.flush()
    return sp.openai_run(server.url, w, transport)


def _raw(server: sp.Server, w: sp.Workload, route: str) -> sp.Run:
    server.flush()
    return sp.raw_run(server.url, w, route)


def _pooled(server: sp.Server, pool: ClientPool, path: str, w: sp.Workload) -> sp.Run:
    server.flush()
    return pool.run(path, server.url, w)


# ---------------------------------------------------------------- the table

def table(a: argparse.Namespace, results: dict) -> None:
    rows = []
    for bs in a.batches:
        base = {m: results.get(("sched", bs, m)) for m in ("constrained", "free")}
        for path in a.paths:
            c, f = results.get((path, bs, "constrained")), results.get((path, bs, "free"))
            if c is None or f is None:
                continue
            vs = lambda s, m: f"{s['tok_s'] / base[m]['tok_s']:.2f}x" if base[m] else "-"  # noqa: E731
            label = f"{path} ({a.client_procs} procs)" if path.endswith("-mp") else path
            rows.append([bs, label, f"{c['tok_s']:.0f}", f"{f['tok_s']:.0f}",
                         f"{c['tok_s'] / f['tok_s']:.2f}x", vs(c, "constrained"), vs(f, "free"),
                         c["tokens"], f"{c['wall']:.2f}", f"{f['wall']:.2f}",
                         f"{c['cpu']:.2f}/{f['cpu']:.2f}", _steps(c, f), f"{c['valid']}/{c['n']}"])
    print_table(f"structured generation by path ({Path(a.model_config).name}"
                f"{' tiny' if a.tiny else ''}, {a.load_format}, {a.grammar_backend}, prompt "
                f"{a.prompt_len}, max_new {a.max_new}, median of {a.repeat})",
                ["batch", "path", "constr. tok/s", "free tok/s", "constr./free",
                 "constr. vs sched", "free vs sched", "constr. tokens", "constr. wall s",
                 "free wall s", "client cpu s (c/f; -mp: all procs)",
                 "fwd/ext steps, hand-offs (c; f); jf/sampled tokens, compiles (c)", "valid JSON"], rows)


def _steps(c: dict[str, Any], f: dict[str, Any]) -> str:
    """The median runs' scheduler counters: forward/extend steps and the Engine's hand-offs of
    single requests (0: one list call), constrained then free; and the constrained run's
    jump-forward/sampled tokens and grammar compiles (a path that lost jump-forward, or
    compiles again, shows here)."""
    def one(s: dict[str, int] | None) -> str:
        return "-" if not s else f"{s['forward_steps']}/{s['extend_steps']}, {s['submit_handoffs']}"
    g = c.get("steps") or {}
    jumps = (f"; jf {g.get('grammar_jump_forward_tokens', 0)}/{g.get('grammar_sampled_tokens', 0)}"
             f", {g.get('grammar_compiles', 0)} compiles") if g else ""
    span = (f"; in Engine {g['engine_span_ms']} of {1e3 * c['wall']:.0f} ms"
            if "engine_span_ms" in g else "")
    return f"{one(c.get('steps'))}; {one(f.get('steps'))}{jumps}{span}"


def main() -> None:
    argv = sys.argv[1:]
    a = parse_args(argv)
    if a.sched_worker:
        return sched_worker(a)
    print(device_line(), flush=True)
    results: dict = {}
    if "sched" in a.paths:
        run_sched(a, [x for x in argv if x != "--sched-worker"], results)
    if {"engine", "lang-local"} & set(a.paths):
        run_engine(a, results)
    if SERVED & set(a.paths):
        run_server(a, results)
    table(a, results)


if __name__ == "__main__":
    main()
