"""Host-side probes for bench_structured_decode.py: per-function wall times (``--breakdown``),
GC pauses, a cProfile of the completion tracker (``--profile-plan``) and the runs' output ids
(``--dump-outputs``). ``step_timeline.py`` has the per-step device/host timeline."""
from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

from common import print_table

# (owner path, attribute) of the functions timed for the breakdown; missing ones are skipped,
# so the same script profiles older and newer code.
HOT = [
    ("sgdsl.runtime.scheduler.scheduler:Scheduler", "step"),
    ("sgdsl.runtime.scheduler.scheduler:Scheduler", "_schedule_prefill"),
    ("sgdsl.runtime.scheduler.stepping:Stepping", "_launch_extend"),
    ("sgdsl.runtime.scheduler.stepping:Stepping", "_launch_decode"),
    ("sgdsl.runtime.scheduler.stepping:Stepping", "_read"),
    ("sgdsl.runtime.scheduler.stepping:Stepping", "_sample"),
    ("sgdsl.runtime.scheduler.inflight:HostIds", "tolist"),
    ("sgdsl.runtime.scheduler.sample_step:BatchSampler", "sample_ids"),
    ("sgdsl.runtime.grammar.manager:GrammarManager", "fill_bitmask"),
    ("sgdsl.runtime.grammar.manager:GrammarManager", "_fill"),
    ("sgdsl.runtime.grammar.manager:GrammarManager", "after_sample"),
    ("sgdsl.runtime.grammar.manager:GrammarManager", "_jump_batch"),
    ("sgdsl.runtime.grammar.manager:GrammarManager", "_advance"),
    ("sgdsl.runtime.grammar.manager:GrammarManager", "_settle"),
    ("sgdsl.runtime.grammar.manager:GrammarManager", "plan_deferred"),
    ("sgdsl.runtime.grammar.prefetch:MaskPrefetch", "result"),
    ("sgdsl.runtime.grammar.forcing.appends:", "jump_forward_batch"),
    ("sgdsl.runtime.scheduler.running:RunningBatch", "mixed_batch"),
    ("sgdsl.runtime.scheduler.stepping:Stepping", "_jumped"),
    ("sgdsl.runtime.grammar.forcing.completion:CompletionTracker", "plan"),
    ("sgdsl.runtime.grammar.forcing.shortest:CompletionSearch", "search"),
    ("sgdsl.runtime.grammar.forcing.shortest:CompletionSearch", "_search"),
    ("sgdsl.runtime.grammar.manager:GrammarManager", "upload_mask"),
    ("sgdsl.runtime.grammar.forcing.jump_forward:", "only_stop_allowed"),
    ("sgdsl.runtime.grammar.backends.xgrammar_matcher:XGrammarGrammar", "fill_bitmask_batch"),
    ("sgdsl.runtime.grammar.backends.xgrammar_matcher:XGrammarGrammar", "accept_token_batch"),
    ("sgdsl.runtime.model.runner:ModelRunner", "forward"),
    ("concurrent.futures:Future", "result"),
]
# name -> [wall s, calls, thread CPU s]: wall well above CPU is waiting (device, GIL, locks)
TIMES: dict[str, list[float]] = defaultdict(lambda: [0.0, 0, 0.0])


def instrument() -> None:
    """Wrap the HOT functions with wall-clock accumulators (thread-safe enough: += on floats
    from the helper thread only races with itself)."""
    import importlib

    for owner, attr in HOT:
        mod_name, _, cls_name = owner.partition(":")
        mod = importlib.import_module(mod_name)
        obj = getattr(mod, cls_name) if cls_name else mod
        fn = getattr(obj, attr, None)
        if fn is None:
            continue
        key = f"{cls_name or mod_name.rsplit('.', 1)[-1]}.{attr}"

        def wrapped(*a, __fn=fn, __key=key, **kw):
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return __fn(*a, **kw)
            finally:
                acc = TIMES[__key]
                acc[0] += time.perf_counter() - t0
                acc[1] += 1
                acc[2] += time.thread_time() - c0
        setattr(obj, attr, wrapped)
        if not cls_name and attr == "only_stop_allowed":  # imported by name into steps.py
            import sgdsl.runtime.grammar.steps as mgr
            if hasattr(mgr, attr):
                setattr(mgr, attr, wrapped)


def gc_timer(phase: str, info: dict) -> None:
    """gc.callbacks hook: time spent in collections (a breakdown row, ``gc.collect``)."""
    acc = TIMES["gc.collect"]
    if phase == "start":
        acc.append(time.perf_counter())
    elif len(acc) > 2:
        acc[0] += time.perf_counter() - acc.pop()
        acc[1] += 1


def profile_method(obj, attr: str):
    """A cProfile of every call of ``obj.attr`` from now on (an instance attribute shadowing
    the class's: ``del obj.attr`` restores it); None when ``obj`` is None."""
    import cProfile

    if obj is None:
        return None
    prof, fn = cProfile.Profile(), getattr(obj, attr)

    def profiled(*a, **kw):
        prof.enable()
        try:
            return fn(*a, **kw)
        finally:
            prof.disable()
    setattr(obj, attr, profiled)
    return prof


def dump_outputs(folder: str, bs: int, mode: str, res: dict, schema: dict) -> None:
    """``res``'s output ids (``run_mode``) as JSON, for ``bench_grammar_host.py --replay``."""
    path = Path(folder) / f"outputs_bs{bs}_{mode}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    ids = [res["by_rid"][f"r{i}"]["output_ids"] for i in range(bs)]
    path.write_text(json.dumps({"schema": schema, "output_ids": ids}))


def print_breakdown(title: str, res: dict) -> None:
    steps = max(res["steps"], 1)
    rows = [[k, f"{1e3 * t / steps:.3f}", f"{1e3 * cpu / steps:.3f}", n,
             f"{1e6 * t / max(n, 1):.1f}"]
            for k, (t, n, cpu) in sorted(res["prof"].items(), key=lambda kv: -kv[1][0])]
    print_table(f"breakdown {title}: ms per step (all {steps} steps)",
                ["function", "ms/step", "cpu ms/step", "calls", "us/call"], rows)
