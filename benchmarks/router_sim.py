"""A discrete-event simulation of the router's policies over replicas with a bounded prefix cache:
issue 30's router workloads on the CPU in seconds, without a GPU or real servers.

The policies are the real ones (``make_policy``, the real ``Worker`` objects and their ledgers,
fed by ``/load``-shaped reports every ``poll_s``); only the replicas are modelled:

each replica is benchmarks/router_replica.py: the server's scheduler rules (prefill-first
extend steps of 2048 tokens, LPM, decode reservation by ``new_token_ratio`` with retraction, the
radix cache's LRU over prefixes and released requests' tokens, ``/load`` as the server computes
it) with step times fitted to the H200 runs (RESULTS.md). ``oracle`` is the perfect partition
(each group on one replica, groups dealt in turn): the ceiling for affinity.

The client keeps ``concurrency`` requests in flight over SGLang's generated-shared-prefix
workload (``groups`` x ``per_group`` prompts, shuffled), as benchmarks/bench_router.py does.
Reported per policy: total tokens/s (prompt + output over the makespan), the hit rate (cached
prompt tokens / prompt tokens) and the balance (most / fewest requests a replica served).

    python benchmarks/router_sim.py kv fits dp4 [--policies cost_aware,round_robin,cache_aware,oracle]
"""
from __future__ import annotations

import argparse
import heapq
import random
import sys
from collections import Counter, deque
from dataclasses import dataclass, replace
from pathlib import Path

from sgdsl.runtime.router.config import RouterConfig
from sgdsl.runtime.router.policies import make_policy
from sgdsl.runtime.router.worker import Worker

sys.path.insert(0, str(Path(__file__).resolve().parent))
from router_replica import Replica, Req, Timing  # noqa: E402  (benchmarks/ is not a package)

CHARS_PER_TOKEN = 4
TIMINGS = ("extend_s", "prefill_s", "decode_step_s", "decode_s", "kv_read_s", "request_s")


@dataclass(frozen=True)
class Shape:
    dp: int = 2
    groups: int = 48
    per_group: int = 16
    prefix: int = 2048  # system prompt tokens, shared by a group
    question: int = 128
    output: int = 128
    concurrency: int = 128
    kv_tokens: int = 60_000  # per replica
    seed: int = 0


# issue 30's workloads (run_router_suite.sh); "fits": the KV of an H200 holds everything
SHAPES = {"fits": Shape(groups=64, output=256, concurrency=256, kv_tokens=800_000),
          "kv": Shape(),
          "dp4": Shape(dp=4, groups=128, per_group=8, concurrency=256, kv_tokens=800_000),
          # guards for "never below round robin": two hot prefixes; no shared prefix at all
          "hot": Shape(groups=2, per_group=384, kv_tokens=800_000),
          "unique": Shape(groups=768, per_group=1, prefix=1024, kv_tokens=800_000)}


class Oracle:
    """Not a router policy: each group to the replicas in turn by first arrival, always (a
    perfect partition, as even as groups allow). The simulator's ceiling for affinity."""

    def __init__(self) -> None:
        self.home: dict[int, int] = {}

    def pick(self, group: int, dp: int) -> int:
        return self.home.setdefault(group, len(self.home) % dp)


def workload(shape: Shape) -> list[tuple[int, str]]:
    """(group, text) of every prompt, shuffled; random letters, ``CHARS_PER_TOKEN`` a token."""
    rng = random.Random(shape.seed)

    def text(tokens: int) -> str:
        return "".join(rng.choices("abcdefghijklmnopqrstuvwxyz ", k=tokens * CHARS_PER_TOKEN))

    prompts = []
    for g in range(shape.groups):
        system = text(shape.prefix)
        prompts += [(g, system + text(shape.question)) for _ in range(shape.per_group)]
    rng.shuffle(prompts)
    return prompts


def simulate(policy_spec: str, shape: Shape, timing: Timing = Timing(),
             prompts: list[tuple[int, str]] | None = None) -> dict:
    """One run of ``policy_spec`` (``name[:key=value+...]``, router options; ``oracle``: the
    perfect partition) over ``shape``."""
    name, _, options = policy_spec.partition(":")
    kwargs = {k: float(v) for k, v in (o.split("=") for o in filter(None, options.split("+")))}
    urls = tuple(f"http://10.0.0.{i + 1}:8000" for i in range(shape.dp))
    oracle = Oracle() if name == "oracle" else None
    config = RouterConfig(worker_urls=urls, policy="round_robin" if oracle else name,
                          chars_per_token=CHARS_PER_TOKEN, **kwargs)
    policy = make_policy(config, random.Random(shape.seed))
    workers = [Worker(u) for u in urls]
    for w in workers:
        policy.on_add(w.url)
    replicas = [Replica(shape.kv_tokens, timing) for _ in urls]
    pending = deque(prompts if prompts is not None else workload(shape))
    events: list = []  # (time, seq, kind, index)
    seq = iter(range(1 << 62))
    reasons: Counter = Counter()
    now = 0.0

    def kick(i: int) -> None:
        rep = replicas[i]
        if not rep.busy:
            duration = rep.step()
            if duration > 0:
                rep.busy = True
                heapq.heappush(events, (now + duration, next(seq), "step", i))

    def submit() -> None:
        group, text = pending.popleft()
        if oracle is not None:
            i, prefill, decode = oracle.pick(group, shape.dp), 0.0, 0.0
        else:
            choice = policy.select(workers, text, shape.output)
            i, prefill, decode = urls.index(choice.worker.url), choice.prefill, choice.decode
            reasons[choice.reason] += 1
        ticket = workers[i].start(prefill, decode)
        prompt = shape.prefix + shape.question
        replicas[i].add(Req(group, shape.prefix, prompt, shape.output, next(seq),
                            (i, ticket, len(text))))
        kick(i)

    for _ in range(min(shape.concurrency, len(pending))):
        submit()
    heapq.heappush(events, (timing.poll_s, next(seq), "poll", -1))
    while events:
        now, _, kind, i = heapq.heappop(events)
        if kind == "poll":
            for w, rep in zip(workers, replicas):
                w.ledger.apply(rep.report(), w.ledger.requested())
            if any(r.busy for r in replicas):
                heapq.heappush(events, (now + timing.poll_s, next(seq), "poll", -1))
            continue
        replicas[i].busy = False
        for r in replicas[i].end_step():
            _, ticket, chars = r.done_cb
            workers[i].finish(ticket)
            policy.observe(chars, r.prompt)
            if pending:
                submit()
        kick(i)
    hit = sum(r.hit_tokens for r in replicas)
    prompt = sum(r.prompt_tokens for r in replicas)
    out = sum(r.served for r in replicas) * shape.output
    served = [r.served for r in replicas]
    assert sum(served) == shape.groups * shape.per_group, served
    return {"policy": policy_spec, "seconds": now, "total_tok_s": (prompt + out) / now,
            "hit_rate": hit / prompt, "balance": max(served) / max(1, min(served)),
            "retracted": sum(r.retracted for r in replicas), "reasons": dict(reasons),
            "groups": [len(r.groups) for r in replicas]}


def mean_runs(spec: str, shape: Shape, timing: Timing, seeds: int) -> dict:
    runs = [simulate(spec, replace(shape, seed=s), timing) for s in range(seeds)]
    row = {k: sum(r[k] for r in runs) / len(runs) for k in runs[0]
           if k not in ("policy", "reasons", "groups")}
    reasons: Counter = Counter()
    for r in runs:
        reasons.update(r["reasons"])
    return {**row, "policy": spec, "reasons": {k: v / seeds for k, v in reasons.items()},
            "groups": [r["groups"] for r in runs]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("shapes", nargs="*", default=["fits", "kv", "dp4"], help=f"of {list(SHAPES)}")
    p.add_argument("--policies", default="cost_aware,round_robin,cache_aware,oracle")
    p.add_argument("--seeds", type=int, default=1, help="workload seeds (mean reported)")
    for name in TIMINGS:
        p.add_argument("--" + name.replace("_", "-"), type=float,
                       default=getattr(Timing(), name))
    p.add_argument("--chunk", type=int, default=Timing.chunk)
    p.add_argument("--reasons", action="store_true", help="the router's decisions by reason")
    args = p.parse_args(argv)
    timing = Timing(**{k: getattr(args, k) for k in (*TIMINGS, "chunk")})
    print(timing)
    for name in args.shapes:
        print(f"{name}: {SHAPES[name]}")
        rows = [mean_runs(spec, SHAPES[name], timing, args.seeds)
                for spec in args.policies.split(",")]
        rr = next((r for r in rows if r["policy"] == "round_robin"), rows[0])
        for r in rows:
            print(f"  {r['policy']:<40} {r['total_tok_s']:>10.0f} tok/s  hit {r['hit_rate']:6.1%}"
                  f"  balance {r['balance']:.2f}  {r['total_tok_s'] / rr['total_tok_s']:.2f}x rr"
                  f"  retracted {r['retracted']:.0f}"
                  + (f"  {r['reasons']} groups per replica {r['groups']}" if args.reasons else ""),
                  flush=True)


if __name__ == "__main__":
    main()
