"""Summary of a scheduler's ``$SGDSL_STEP_TRACE`` file (runtime/scheduler/step_trace.py): the
distribution of its loop iterations' host time and of the gaps between launches (a running
request's token interval when it decodes every step), and the slowest iterations with where
their time went. ``python benchmarks/gpu/step_trace_report.py FILE...``"""
from __future__ import annotations

import json
import sys

SKIP = ("t", "ms", "handle_ms", "msgs", "running", "waiting", "launched", "extend")


def load(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def summarize(path: str, top: int = 8) -> str:
    rows = load(path)
    steps = [r for r in rows if r["launched"]]
    if not steps:
        return f"{path}: no launched steps"
    ms = [r["ms"] for r in steps]
    # NOTE: only gaps with requests decoding on both sides: an idle server's gaps are no stall
    gaps_ms = [(b["t"] - a["t"]) * 1e3 for a, b in zip(steps, steps[1:])
               if a["running"] and b["running"]]
    lines = [f"{path}: {len(steps)} launched iterations ({sum(r['extend'] for r in steps)} "
             f"extend), iteration ms p50 {pct(ms, 50):.1f} p99 {pct(ms, 99):.1f} max "
             f"{max(ms):.1f}; launch-to-launch gap while decoding, ms: p50 {pct(gaps_ms, 50):.1f} p99 "
             f"{pct(gaps_ms, 99):.1f} max {max(gaps_ms, default=0):.1f}",
             "  slowest iterations (parts in ms; pd counters: change in that iteration):"]
    if any("pd_waiting_kv_reqs" in r for r in steps):  # decode server: transfers in flight?
        busy = [r["ms"] for r in steps if r.get("pd_waiting_kv_reqs")]
        calm = [r["ms"] for r in steps if not r.get("pd_waiting_kv_reqs")]
        lines.insert(1, f"  iteration ms with KV transfers in flight: p50 {pct(busy, 50):.1f} "
                        f"p99 {pct(busy, 99):.1f} (n={len(busy)}); without: p50 "
                        f"{pct(calm, 50):.1f} p99 {pct(calm, 99):.1f} (n={len(calm)})")
    # per part: mean host ms per launched iteration (what a part costs the loop on average:
    # e.g. the hierarchical cache's loads and backups beside the same engine without them)
    totals: dict[str, float] = {}
    for r in steps:
        for k, v in r.items():
            if k not in SKIP and not k.startswith("pd_"):
                totals[k] = totals.get(k, 0.0) + v
    lines.insert(1, "  mean ms per iteration: " + ", ".join(
        f"{k} {v / len(steps):.3f}" for k, v in sorted(totals.items(), key=lambda kv: -kv[1])))
    prev = {id(b): a for a, b in zip(rows, rows[1:])}
    for r in sorted(steps, key=lambda r: -r["ms"])[:top]:
        before = prev.get(id(r), {})
        parts = {k: v for k, v in r.items() if k not in SKIP and not k.startswith("pd_")}
        pd = {k: v - before.get(k, 0) for k, v in r.items()
              if k.startswith("pd_") and not k.endswith("_reqs") and v != before.get(k, 0)}
        pd.update({k: v for k, v in r.items() if k.endswith("_reqs") and v})
        lines.append(f"  t={r['t']:.2f}s {r['ms']:.1f} ms extend={r['extend']} "
                     f"running={r['running']} waiting={r['waiting']} msgs={r['msgs']} "
                     f"handle={r['handle_ms']:.1f} {json.dumps(parts)} {json.dumps(pd)}")
    return "\n".join(lines)


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(summarize(p))
