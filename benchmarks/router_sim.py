"""A discrete-event simulation of the router's policies over replicas with a bounded prefix cache:
issue 30's router workloads on the CPU in seconds, without a GPU or real servers.

The policies are the real ones (``make_policy``, the real ``Worker`` objects and their ledgers,
fed by ``/load``-shaped reports every ``poll_s``); only the replicas are modelled:

- each replica has ``kv_tokens`` KV slots: cached group prefixes (LRU; a prefix held by a
  running request cannot go) and each running request's own question + output tokens (reserved
  in full at admission, as a conservative scheduler does); the FIFO queue's head waits until
  evicting unpinned prefixes makes room for it;
- a prefix is cached once the request that computed it finished its prefill; a request of the
  same group waits in the queue until then (the scheduler's in-batch prefix sharing);
- one step prefills up to ``chunk`` tokens (FIFO) and decodes one token of every other running
  request; it takes ``step_s + prefill_s x prefill tokens + decode_s x decoding requests``
  (defaults chosen so that round_robin, cache_aware and cost_aware land near their measured
  ratios on 2-4 H200s running a dummy Llama-3.1-8B: RESULTS.md).

The client keeps ``concurrency`` requests in flight over SGLang's generated-shared-prefix
workload (``groups`` x ``per_group`` prompts, shuffled), as benchmarks/bench_router.py does.
Reported per policy: total tokens/s (prompt + output over the makespan), the hit rate (cached
prompt tokens / prompt tokens) and the balance (most / fewest requests a replica served).

    python benchmarks/router_sim.py kv fits dp4 [--policies cost_aware,round_robin,cache_aware]
"""
from __future__ import annotations

import argparse
import heapq
import random
from collections import OrderedDict, deque
from dataclasses import dataclass, field, replace

from sgdsl.runtime.router.config import RouterConfig
from sgdsl.runtime.router.ledger import LoadReport
from sgdsl.runtime.router.policies import make_policy
from sgdsl.runtime.router.worker import Worker

CHARS_PER_TOKEN = 4


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


@dataclass(frozen=True)
class Timing:
    step_s: float = 0.006
    prefill_s: float = 15e-6  # per prefilled token
    decode_s: float = 1.5e-4  # per decoding request in a step
    chunk: int = 8192  # prefill tokens per step
    poll_s: float = 0.05  # the router's /load interval


# issue 30's workloads (run_router_suite.sh); "fits": the KV of an H200 holds everything
SHAPES = {"fits": Shape(groups=64, output=256, concurrency=256, kv_tokens=800_000),
          "kv": Shape(),
          "dp4": Shape(dp=4, groups=128, per_group=8, concurrency=256, kv_tokens=800_000)}


@dataclass
class Req:
    group: int
    text: str
    prompt: int
    output: int
    done_cb: object
    uncached: int = 0
    prefilled: int = 0
    generated: int = 0
    hit: int = 0
    step_prefill: int = 0


@dataclass
class Replica:
    """One modelled server: an LRU cache of group prefixes, a FIFO queue, a running batch."""
    shape: Shape
    timing: Timing
    cache: OrderedDict = field(default_factory=OrderedDict)  # group -> ready (prefill done)
    pins: dict = field(default_factory=dict)  # group -> running requests using it
    waiting: deque = field(default_factory=deque)
    running: list = field(default_factory=list)
    private: int = 0  # KV reserved by running requests beyond their prefix
    busy: bool = False
    hit_tokens: int = 0
    prompt_tokens: int = 0
    served: int = 0

    def used(self) -> int:
        return len(self.cache) * self.shape.prefix + self.private

    def report(self) -> LoadReport:
        cached = lambda r: self.shape.prefix if self.cache.get(r.group) else 0  # noqa: E731
        queued = sum(r.prompt - cached(r) for r in self.waiting)
        queued += sum(r.uncached - r.prefilled for r in self.running)
        decode = sum(r.output - r.generated for r in (*self.waiting, *self.running))
        kv = self.shape.kv_tokens
        held = self.private + self.shape.prefix * sum(1 for n in self.pins.values() if n)
        return LoadReport(len(self.waiting), len(self.running), queued, decode,
                          held / kv, kv, max(0, kv - self.used()))

    def _admit(self) -> None:
        """FIFO, except that a request whose prefix another request is computing right now
        waits for it (the scheduler's in-batch prefix sharing) and the others go on."""
        s = self.shape
        for r in list(self.waiting):
            if self.cache.get(r.group) is False:
                continue
            new = r.group not in self.cache
            need = s.question + r.output + (s.prefix if new else 0)
            if not self._make_room(need) and self.running:
                return
            self.waiting.remove(r)
            ready = self.cache.get(r.group, False)
            self.cache[r.group] = ready
            self.cache.move_to_end(r.group)
            self.pins[r.group] = self.pins.get(r.group, 0) + 1
            r.hit = s.prefix if ready else 0
            r.uncached = r.prompt - r.hit
            self.private += s.question + r.output
            self.hit_tokens += r.hit
            self.prompt_tokens += r.prompt
            self.running.append(r)

    def _make_room(self, need: int) -> bool:
        kv = self.shape.kv_tokens
        for group in list(self.cache):
            if kv - self.used() >= need:
                return True
            if not self.pins.get(group):
                del self.cache[group]
        return kv - self.used() >= need

    def step(self) -> float:
        """Start a step: admit, then the step's duration."""
        self._admit()
        budget, prefill, decoding = self.timing.chunk, 0, 0
        for r in self.running:
            left = r.uncached - r.prefilled
            if left > 0:
                take = min(left, budget)
                budget -= take
                prefill += take
                r.step_prefill = take
            else:
                r.step_prefill = 0
                decoding += 1
        t = self.timing
        return t.step_s + t.prefill_s * prefill + t.decode_s * decoding

    def end_step(self) -> list[Req]:
        """The step's effects; returns the requests that finished."""
        finished = []
        for r in self.running:
            if r.step_prefill:
                r.prefilled += r.step_prefill
                if r.prefilled >= r.uncached and r.group in self.cache:
                    self.cache[r.group] = True
            elif r.prefilled >= r.uncached:
                r.generated += 1
                if r.generated >= r.output:
                    finished.append(r)
        for r in finished:
            self.running.remove(r)
            self.private -= self.shape.question + r.output
            self.pins[r.group] -= 1
            self.served += 1
        return finished


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
    """One run of ``policy_spec`` (``name[:key=value+...]``, router options) over ``shape``."""
    name, _, options = policy_spec.partition(":")
    kwargs = {k: float(v) for k, v in (o.split("=") for o in filter(None, options.split("+")))}
    urls = tuple(f"http://10.0.0.{i + 1}:8000" for i in range(shape.dp))
    config = RouterConfig(worker_urls=urls, policy=name, chars_per_token=CHARS_PER_TOKEN, **kwargs)
    policy = make_policy(config, random.Random(shape.seed))
    workers = [Worker(u) for u in urls]
    for w in workers:
        policy.on_add(w.url)
    replicas = [Replica(shape, timing) for _ in urls]
    pending = deque(prompts if prompts is not None else workload(shape))
    events: list = []  # (time, seq, kind, index)
    seq = iter(range(1 << 62))
    now = 0.0

    def kick(i: int) -> None:
        rep = replicas[i]
        if not rep.busy and (rep.waiting or rep.running):
            rep.busy = True
            heapq.heappush(events, (now + rep.step(), next(seq), "step", i))

    def submit() -> None:
        group, text = pending.popleft()
        choice = policy.select(workers, text, shape.output)
        i = urls.index(choice.worker.url)
        ticket = choice.worker.start(choice.prefill, choice.decode)
        prompt = shape.prefix + shape.question
        replicas[i].waiting.append(Req(group, text, prompt, shape.output, (i, ticket, len(text))))
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
    return {"policy": policy_spec, "seconds": now, "total_tok_s": (prompt + out) / now,
            "hit_rate": hit / prompt, "balance": max(served) / max(1, min(served))}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("shapes", nargs="*", default=list(SHAPES), help=f"of {list(SHAPES)}")
    p.add_argument("--policies", default="cost_aware,round_robin,cache_aware")
    p.add_argument("--seeds", type=int, default=1, help="workload seeds (mean reported)")
    p.add_argument("--prefill-s", type=float, default=Timing.prefill_s, help="per token")
    p.add_argument("--decode-s", type=float, default=Timing.decode_s, help="per request a step")
    args = p.parse_args(argv)
    timing = Timing(prefill_s=args.prefill_s, decode_s=args.decode_s)
    for name in args.shapes:
        print(f"{name}: {SHAPES[name]}")
        rows = []
        for spec in args.policies.split(","):
            runs = [simulate(spec, replace(SHAPES[name], seed=s), timing)
                    for s in range(args.seeds)]
            rows.append({k: (sum(r[k] for r in runs) / len(runs) if k != "policy" else spec)
                         for k in runs[0]})
        rr = next((r for r in rows if r["policy"] == "round_robin"), rows[0])
        for r in rows:
            print(f"  {r['policy']:<40} {r['total_tok_s']:>10.0f} tok/s  hit {r['hit_rate']:6.1%}"
                  f"  balance {r['balance']:.2f}  {r['total_tok_s'] / rr['total_tok_s']:.2f}x rr")


if __name__ == "__main__":
    main()
