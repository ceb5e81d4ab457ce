"""A discrete-event simulation of the router's policies over replicas with a bounded prefix cache:
issue 30's router workloads on the CPU in seconds, without a GPU or real servers.

The policies are the real ones (``make_policy``, the real ``Worker`` objects and their ledgers,
fed by ``/load``-shaped reports every ``poll_s``); only the replicas are modelled, by
benchmarks/router_replica.py: the server's scheduler rules (prefill-first
extend steps of 2048 tokens, LPM, decode reservation by ``new_token_ratio`` with retraction, the
radix cache's LRU over prefixes and released requests' tokens, ``/load`` as the server computes
it) with step times fitted to the H200 runs (RESULTS.md). ``oracle`` is the perfect partition
(each group on one replica, groups dealt in turn): the ceiling for affinity.

The client keeps ``concurrency`` requests in flight over SGLang's generated-shared-prefix
workload (``groups`` x ``per_group`` prompts, shuffled), as benchmarks/bench_router.py does.
Reported per policy: total tokens/s (prompt + output over the makespan), the hit rate (cached
prompt tokens / prompt tokens), the balance (most / fewest requests a replica served), the
replicas' retractions and, with ``--reasons``, the router's decisions and the groups sent to
each replica.

    python benchmarks/router_sim.py [fits kv dp4 hot unique] [--seeds 3] [--reasons]
        [--policies cost_aware,round_robin,cache_aware,oracle]
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


class Run:
    """One simulated run: the router's policy (``name[:key=value+...]``, router options; or
    ``oracle``, the perfect partition) in front of modelled replicas, a closed-loop client."""

    def __init__(self, policy_spec: str, shape: Shape, timing: Timing,
                 prompts: list[tuple[int, str]] | None) -> None:
        name, _, options = policy_spec.partition(":")
        kwargs = {k: float(v) for k, v in (o.split("=") for o in filter(None, options.split("+")))}
        self.spec, self.shape, self.timing = policy_spec, shape, timing
        self.urls = tuple(f"http://10.0.0.{i + 1}:8000" for i in range(shape.dp))
        self.oracle = Oracle() if name == "oracle" else None
        config = RouterConfig(worker_urls=self.urls, policy="round_robin" if self.oracle else name,
                              chars_per_token=CHARS_PER_TOKEN, **kwargs)
        self.policy = make_policy(config, random.Random(shape.seed))
        self.workers = [Worker(u) for u in self.urls]
        for w in self.workers:
            self.policy.on_add(w.url)
        self.replicas = [Replica(shape.kv_tokens, timing) for _ in self.urls]
        self.pending = deque(prompts if prompts is not None else workload(shape))
        self.events: list = []  # (time, seq, kind, replica index)
        self.seq = iter(range(1 << 62))
        self.reasons: Counter = Counter()
        self.now = 0.0

    def kick(self, i: int) -> None:
        rep = self.replicas[i]
        if not rep.busy:
            duration = rep.step()
            if duration > 0:
                rep.busy = True
                heapq.heappush(self.events, (self.now + duration, next(self.seq), "step", i))

    def submit(self) -> None:
        group, text = self.pending.popleft()
        s = self.shape
        if self.oracle is not None:
            i, prefill, decode = self.oracle.pick(group, s.dp), 0.0, 0.0
        else:
            choice = self.policy.select(self.workers, text, s.output)
            i, prefill, decode = self.urls.index(choice.worker.url), choice.prefill, choice.decode
            self.reasons[choice.reason] += 1
        ticket = self.workers[i].start(prefill, decode)
        self.replicas[i].add(Req(group, s.prefix, s.prefix + s.question, s.output,
                                 next(self.seq), (ticket, len(text))))
        self.kick(i)

    def run(self) -> dict:
        for _ in range(min(self.shape.concurrency, len(self.pending))):
            self.submit()
        heapq.heappush(self.events, (self.timing.poll_s, next(self.seq), "poll", -1))
        while self.events:
            self.now, _, kind, i = heapq.heappop(self.events)
            if kind == "poll":
                self.poll()
                continue
            self.replicas[i].busy = False
            for r in self.replicas[i].end_step():
                ticket, chars = r.done_cb
                self.workers[i].finish(ticket)
                self.policy.observe(chars, r.prompt)
                if self.pending:
                    self.submit()
            self.kick(i)
        return self.summary()

    def poll(self) -> None:
        """Every worker's /load into its ledger (asked for and answered at once)."""
        for w, rep in zip(self.workers, self.replicas):
            w.ledger.apply(rep.report(), w.ledger.requested())
        if any(r.busy for r in self.replicas):
            heapq.heappush(self.events, (self.now + self.timing.poll_s, next(self.seq), "poll", -1))

    def summary(self) -> dict:
        reps, s = self.replicas, self.shape
        hit = sum(r.hit_tokens for r in reps)
        prompt = sum(r.prompt_tokens for r in reps)
        served = [r.served for r in reps]
        assert sum(served) == s.groups * s.per_group, served
        return {"policy": self.spec, "seconds": self.now,
                "total_tok_s": (prompt + sum(served) * s.output) / self.now,
                "hit_rate": hit / prompt, "balance": max(served) / max(1, min(served)),
                "retracted": sum(r.retracted for r in reps), "reasons": dict(self.reasons),
                "groups": [len(r.groups) for r in reps]}


def simulate(policy_spec: str, shape: Shape, timing: Timing = Timing(),
             prompts: list[tuple[int, str]] | None = None) -> dict:
    """One run of ``policy_spec`` over ``shape`` (see ``Run``)."""
    return Run(policy_spec, shape, timing, prompts).run()


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
