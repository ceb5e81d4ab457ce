"""``run_batch`` on ``Local`` vs ``Engine.generate`` of the same list (issue 29 item 1: the
language's path at the scheduler's pace), one Engine, rounds interleaved, CPU.

Per batch size and mode (``json``: the person schema, max_new tokens; ``plain``: ignore_eos at
the lengths the JSON run produced), each round runs:

- ``engine-ids``: ``Engine.generate(input_ids=[...])`` (what ``bench_structured_paths``' engine
  row sends);
- ``engine-text``: ``Engine.generate(prompt=[...])``, the same prompts as text (what Local
  sends: the tokenization is the path's own cost);
- ``lang``: ``run_batch`` of a ``@function`` with ``gen(json_schema=...)`` (or a free gen) on
  ``Local(engine=...)``;
- ``lang-nohold``: the same with the burst gate off (``sgdsl.backends.burst.MAX_HOLD_S = 0``:
  each coalescer flush at the next loop turn, as before the gate), when the tree has one;
- ``lang-gc``: the same with the collector left on while the batch starts
  (``sgdsl.interpreter.gc_pause.MAX_PAUSE_S = 0``, as before the pause), when the tree has it.

Printed per row (medians): wall, tokens/s vs engine-ids, the scheduler's forward and extend
steps, the hand-offs to the engine the path made (list calls, plus the Engine's submitter's
hand-offs of single calls gathered per loop turn) and when the last one's requests, built and
tokenized, left for the scheduler ("all sent": until then the scheduler cannot have the whole batch), and
CPU seconds of this process (the front end: interpreter, request building, tokenization, result
handling) and of the scheduler process, per request, and this process's garbage collections
before the hand-off (count and ms: they delay it) and in the whole run. On the 2-core dev box wall times move with
the other engineers' jobs; the step counts, call counts and CPU seconds are the stable part.

    OMP_NUM_THREADS=1 python benchmarks/bench_lang_local.py --batches 32 256 --repeat 3
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_engine_frontend as bef  # noqa: E402
from person_programs import SCHEMA_TEXT, person_programs  # noqa: E402



def programs() -> dict[str, Any]:
    constrained, free = person_programs()
    return {"json": constrained, "plain": free}


class Paths:
    """The Engine, a Local on it, and the counters every run reads."""

    def __init__(self, engine: Any) -> None:
        from sgdsl.backends import Local

        self.engine = engine
        self.local = Local(engine=engine)
        self.programs = programs()
        self.calls: list[tuple[float, int]] = []  # (perf_counter, prompts) per engine call
        self.collections: list[tuple[float, float]] = []  # (start, seconds) per gc collection
        started: list[float] = [0.0]

        def collected(phase: str, info: dict) -> None:
            if phase == "start":
                started[0] = time.perf_counter()
            else:
                self.collections.append((started[0], time.perf_counter() - started[0]))
        gc.callbacks.append(collected)
        self.sent: list[float] = []  # when each call's requests, tokenized, left for the engine
        inner, tm_generate, tm_submit = (engine.async_generate, engine._tm.generate,
                                         engine._tm.submit)

        def handed(specs: Any, *args: Any) -> Any:  # made in the caller's thread, after _build
            self.sent.append(time.perf_counter())
            return tm_generate(specs, *args)
        engine._tm.generate = handed

        def submitted(specs: Any, *args: Any) -> Any:  # single calls, gathered per loop turn
            self.sent.append(time.perf_counter())
            return tm_submit(specs, *args)
        engine._tm.submit = submitted

        async def counted(*args: Any, **kwargs: Any) -> Any:
            prompt = kwargs.get("prompt", kwargs.get("input_ids"))
            many = isinstance(prompt, list) and bool(prompt) and not isinstance(prompt[0], int)
            self.calls.append((time.perf_counter(), len(prompt) if many else 1))
            return await inner(*args, **kwargs)
        engine.async_generate = counted  # Local's only way in

    def run(self, path: str, texts: list[str], ids: list[list[int]], mode: str,
            budgets: list[int]) -> dict[str, Any]:
        go = self._runner(path, texts, ids, mode, budgets)
        self.engine.flush_cache()
        self.calls.clear()
        self.sent.clear()
        self.collections.clear()
        child = self.engine._tm.proc.pid
        st0 = self.engine.stats()
        cpu0, sched0, t0 = time.process_time(), bef.cpu_seconds(child), time.perf_counter()
        lengths = go()
        wall = time.perf_counter() - t0
        cpu, sched = time.process_time() - cpu0, bef.cpu_seconds(child) - sched0
        st1 = self.engine.stats()
        handoffs = st1.get("submit_handoffs", 0) - st0.get("submit_handoffs", 0)
        last = self.sent[-1] if self.sent else float("inf")
        early = [d for t, d in self.collections if t < last]
        lists = sum(1 for _, n in self.calls if n > 1)  # list calls; single ones: hand-offs
        return {"wall": wall, "lengths": lengths, "main_cpu": cpu, "sched_cpu": sched,
                "steps": st1["forward_steps"] - st0["forward_steps"],
                "extends": st1["extend_steps"] - st0["extend_steps"],
                "calls": lists + handoffs if path.startswith("lang") else 1,
                "sent_ms": 1e3 * (self.sent[-1] - t0) if self.sent else float("nan"),
                "gc_early": len(early), "gc_early_ms": 1e3 * sum(early),
                "gc_ms": 1e3 * sum(d for _, d in self.collections)}

    def _runner(self, path: str, texts: list[str], ids: list[list[int]], mode: str,
                budgets: list[int]) -> Callable[[], list[int]]:
        params = [{"max_new_tokens": b, "temperature": 0.0,
                   **({"json_schema": SCHEMA_TEXT} if mode == "json" else {"ignore_eos": True})}
                  for b in budgets]
        if path == "engine-ids":
            return lambda: [len(o["output_ids"]) for o in
                            self.engine.generate(input_ids=ids, sampling_params=params)]
        if path == "engine-text":
            return lambda: [len(o["output_ids"]) for o in
                            self.engine.generate(prompt=texts, sampling_params=params)]
        program, batch = self.programs[mode], [{"prompt": t, "budget": b}
                                               for t, b in zip(texts, budgets)]

        def lang() -> list[int]:
            burst = sys.modules.get("sgdsl.backends.burst")  # None: a tree without the gate
            saved = burst.MAX_HOLD_S if burst else 0.0
            pause = sys.modules.get("sgdsl.interpreter.gc_pause")
            saved_pause = getattr(pause, "MAX_PAUSE_S", None)
            if burst is not None and path == "lang-nohold":
                burst.MAX_HOLD_S = 0.0
            if saved_pause is not None and path == "lang-gc":
                pause.MAX_PAUSE_S = 0.0
            try:
                states = program.run_batch(batch, backend=self.local)
            finally:
                if burst is not None:
                    burst.MAX_HOLD_S = saved
                if saved_pause is not None:
                    pause.MAX_PAUSE_S = saved_pause
            for s in states:
                if s.error() is not None:
                    raise s.error()
            return [s.get_meta_info("out")["completion_tokens"] for s in states]
        return lang


def has_gate() -> bool:
    try:
        import sgdsl.backends.burst  # noqa: F401
    except ImportError:
        return False
    return True


def has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def run(a: argparse.Namespace) -> dict[tuple, list[dict]]:
    from sgdsl.runtime import Engine

    paths_run = (["engine-ids", "engine-text", "lang"] + (["lang-nohold"] if has_gate() else [])
                 + (["lang-gc"] if has_module("sgdsl.interpreter.gc_pause") else []))
    paths_run = [p for p in paths_run if p == "engine-ids" or a.paths is None or p in a.paths]
    results: dict[tuple, list[dict]] = {}
    with Engine(bef.make_config(a)) as engine:
        paths = Paths(engine)
        for bs in a.batches:
            ids = bef.prompts_for(bs, a.prompt_len, seed=bs)
            texts = [engine.tokenizer.decode(p) for p in ids]
            ids = [engine.tokenizer.encode(t, add_special_tokens=False) for t in texts]
            json_budgets = [a.max_new] * bs
            warm = paths.run("engine-ids", texts, ids, "json", json_budgets)  # compile, kernels
            lengths = [max(1, k) for k in warm["lengths"]]
            for path in paths_run[1:]:
                paths.run(path, texts, ids, "plain", [4] * bs)  # warm each path
            for r in range(a.repeat):
                for mode, budgets in (("json", json_budgets), ("plain", lengths)):
                    if mode not in a.modes:
                        continue
                    order = paths_run if r % 2 == 0 else paths_run[::-1]
                    for path in order:
                        results.setdefault((bs, mode, path), []).append(
                            paths.run(path, texts, ids, mode, budgets))
        engine.check_idle_integrity()
    return results


def report(a: argparse.Namespace, results: dict[tuple, list[dict]]) -> None:
    print(f"\n## run_batch on Local vs Engine.generate (tiny 2-layer Llama, cpu, prompt "
          f"{a.prompt_len}, max_new {a.max_new}, median of {a.repeat} interleaved rounds)")
    print("| batch | mode | path | tokens | wall s | tok/s vs engine-ids | fwd steps | extend "
          "steps | hand-offs | all sent ms | main CPU ms/req | sched CPU ms/req | gc before "
          "hand-off (n, ms) | gc ms in all |")
    print("|" + "---|" * 14)
    med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
    for (bs, mode, path), rs in results.items():
        base = results[bs, mode, "engine-ids"]
        tokens = sum(rs[0]["lengths"])
        ratio = (tokens / med(rs, "wall")) / (sum(base[0]["lengths"]) / med(base, "wall"))
        print(f"| {bs} | {mode} | {path} | {tokens} | {med(rs, 'wall'):.3f} | {ratio:.3f}x | "
              f"{med(rs, 'steps'):.0f} | {med(rs, 'extends'):.0f} | {med(rs, 'calls'):.0f} | "
              f"{med(rs, 'sent_ms'):.1f} | {1e3 * med(rs, 'main_cpu') / bs:.3f} | "
              f"{1e3 * med(rs, 'sched_cpu') / bs:.2f} | {med(rs, 'gc_early'):.0f}, "
              f"{med(rs, 'gc_early_ms'):.1f} | {med(rs, 'gc_ms'):.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="config dir (dummy weights); default: tiny")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    ap.add_argument("--batches", type=int, nargs="+", default=[32, 256])
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--chunk", type=int, default=8192, help="chunked_prefill_size")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (CPU)")
    ap.add_argument("--mem-fraction", type=float, default=0.3)
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds (median)")
    ap.add_argument("--paths", nargs="+", default=None,
                    help="paths to run besides engine-ids (default: all this tree has)")
    ap.add_argument("--modes", nargs="+", default=["json", "plain"], choices=["json", "plain"])
    a = ap.parse_args()
    report(a, run(a))


if __name__ == "__main__":
    main()
