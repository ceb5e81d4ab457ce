"""Where inter-token gaps are born: ``bench_pd.py --hop-times``'s report of the chunks' hop
times (runtime/hop_times.py: scheduler sent, main process received, chunk built, server wrote,
router forwarded; then the client's own receive time).

For two consecutive chunks of one stream, the gap at hop h is the difference of their times
at h; the client's gap (its ITL) telescopes into the scheduler's gap plus what each later hop
added (its gap minus the previous hop's gap: the second chunk took that much longer than the
first to pass that hop). Reported: each hop's latency (from the previous hop) over all chunks,
and over the gaps at or above the client's p99, the mean each hop added and how often it added
the most ("born at"), plus the tokens those chunks carried (a chunk of several tokens is a step
whose output waited, or text held back).
"""
from __future__ import annotations

from typing import Any

SERVER_HOPS = ("sched", "recv", "detok", "server")


def hop_names(events: list[list]) -> list[str]:
    """The hops these events have: the server's, the router's if it stamped, the client."""
    routed = any(e[3] is not None for e in events)
    return [*SERVER_HOPS, *(["router"] if routed else []), "client"]


def times(event: list, names: list[str]) -> list[float] | None:
    """The event's time at every hop of ``names`` (None if one is missing)."""
    t_client, _, hops, t_router = event[:4]
    if hops is None or len(hops) < len(SERVER_HOPS):
        return None
    row = list(hops[:len(SERVER_HOPS)])
    if "router" in names:
        if t_router is None:
            return None
        row.append(t_router)
    return row + [t_client]


def pairs(results: list[dict[str, Any]]) -> tuple[list[str], list[tuple]]:
    """(hop names, [(times of chunk i-1, times of chunk i, tokens of chunk i, its hop steps
    [steps, text holds])]) over every stream's consecutive chunks."""
    names: list[str] = []
    out = []
    for r in results:
        events = r.get("events")
        if not events:
            continue
        names = names or hop_names(events)
        rows = [(times(e, names), e[1], e[4] or (0, 0)) for e in events]
        for (a, n_a, _), (b, n_b, steps) in zip(rows, rows[1:]):
            if a is not None and b is not None:
                out.append((a, b, n_b - n_a, steps))
    return names, out


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def _mean(xs: Any) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")


def summarize(results: list[dict[str, Any]], label: str) -> str:
    names, rows = pairs(results)
    if not rows:
        return f"{label}: no hop times (servers without $SGDSL_HOP_TIMES=1?)"
    lines = [f"{label}: {len(rows)} gaps; hop latency from the previous hop, ms "
             "(p50 / p99 / max):"]
    for h in range(1, len(names)):
        lat = [b[h] - b[h - 1] for _, b, *_ in rows]
        lines.append(f"  {names[h - 1]:>6} -> {names[h]:<6} {pct(lat, 50) * 1e3:8.2f} "
                     f"{pct(lat, 99) * 1e3:8.2f} {max(lat) * 1e3:8.2f}")
    gaps = [[b[h] - a[h] for h in range(len(names))] for a, b, *_ in rows]
    client = [g[-1] for g in gaps]
    p99 = pct(client, 99)
    tail = [(g, row) for g, row in zip(gaps, rows) if g[-1] >= p99]
    lines.append(f"  gap p50/p99 per hop, ms: " + ", ".join(
        f"{name} {pct([g[h] for g in gaps], 50) * 1e3:.1f}/"
        f"{pct([g[h] for g in gaps], 99) * 1e3:.1f}" for h, name in enumerate(names)))
    added = [[g[0]] + [g[h] - g[h - 1] for h in range(1, len(names))] for g, _ in tail]
    born = [max(range(len(names)), key=lambda h: a[h]) for a in added]
    lines.append(f"  the {len(tail)} client gaps >= p99 ({p99 * 1e3:.1f} ms): mean added per "
                 f"hop, ms (born there: count): " + ", ".join(
                     f"{name} {sum(a[h] for a in added) / len(added) * 1e3:.1f} "
                     f"({born.count(h)})" for h, name in enumerate(names)))
    tail_rows = [r for _, r in tail]
    lines.append("  per chunk, all / those gaps: " + ", ".join(
        f"{what} {_mean(f(r) for r in rows):.2f} / {_mean(f(r) for r in tail_rows):.2f}"
        for what, f in (("tokens", lambda r: r[2]), ("steps", lambda r: r[3][0]),
                        ("share with text held back", lambda r: r[3][1] > 0))))
    return "\n".join(lines)
