"""The scheduler's own host CPU per request on the router's workload, with no model at all.

A ``NullRunner`` answers every forward with constant logits (no per-token work), so what a
closed loop of requests costs here is the scheduler's bookkeeping alone: admission (LPM
passes over the waiting queue, prefix matching, slot allocation), batch building, reading
tokens, finishing (radix inserts, frees). The workload is ``bench_router.py``'s shape as token
ids: ``--groups`` x ``--prompts-per-group`` prompts of a shared ``--system-prompt-len`` prefix
plus a ``--question-len`` question, ``--output-len`` tokens each, ``--concurrency`` in flight
(a finished request is replaced by the next at once, as a closed-loop client does), a KV pool
of ``--max-total-tokens`` slots (the router's ``kv`` workload holds 60,000). Run it with another
tree's interpreter for a before/after (the numbers are this process's CPU time).

    python benchmarks/bench_scheduler_host.py --groups 24 --prompts-per-group 16 \\
        --concurrency 64 --output-len 128 --max-total-tokens 60000
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import time

import torch

from sgdsl.runtime.cache.pool import ReqToTokenPool, TokenKVPool
from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.ipc import messages as m
from sgdsl.runtime.sampling_params import SamplingParams
from sgdsl.runtime.scheduler.scheduler import Scheduler

VOCAB = 64


class NullRunner:
    """The runner's interface with no model: one constant logits row per sampled position."""

    def __init__(self, num_slots: int, max_reqs: int, context_len: int) -> None:
        self.req_to_token_pool = ReqToTokenPool(max_reqs, context_len, "cpu")
        self.token_kv_pool = TokenKVPool(num_slots, 1, 1, 1, torch.float32, "cpu")
        self.context_len = context_len
        self.row = torch.arange(VOCAB, dtype=torch.float32).view(1, -1)  # argmax: VOCAB - 1

    def forward(self, batch) -> torch.Tensor:
        rows = batch.batch_size if batch.logits_indices is None else batch.logits_indices.numel()
        return self.row.expand(rows, VOCAB)


def workload(a: argparse.Namespace) -> list[list[int]]:
    rng = random.Random(a.seed)
    prompts = []
    for _ in range(a.groups):
        system = [rng.randrange(100, 30000) for _ in range(a.system_prompt_len)]
        prompts += [system + [rng.randrange(100, 30000) for _ in range(a.question_len)]
                    for _ in range(a.prompts_per_group)]
    rng.shuffle(prompts)
    return prompts


def run(a: argparse.Namespace, prompts: list[list[int]]) -> dict[str, float]:
    context = a.system_prompt_len + a.question_len + a.output_len + 8
    runner = NullRunner(a.max_total_tokens, a.concurrency, context)
    finished: list[str] = []

    def send(msg) -> None:
        if isinstance(msg, m.BatchTokenOut):
            finished.extend(o.rid for o in msg.outs if o.finish_reason is not None)
    sched = Scheduler(runner, EngineConfig(max_running_requests=a.concurrency), [VOCAB + 1],
                      None, send)
    sp = SamplingParams(max_new_tokens=a.output_len, temperature=0.0, ignore_eos=True)
    queue = list(enumerate(prompts))
    live = 0
    cpu, wall = time.process_time(), time.perf_counter()
    while queue or live:
        while queue and live < a.concurrency:
            i, ids = queue.pop(0)
            sched.handle(m.TokenizedGenerateReq(str(i), ids, sp))
            live += 1
        sched.step()
        live -= len(finished)
        finished.clear()
    while sched.step():
        pass
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    c = sched.counters
    return {"cpu_ms_per_req": 1000 * cpu / len(prompts), "wall_s": wall,
            "steps": c["forward_steps"], "extends": c["extend_steps"],
            "retractions": c["retractions_total"],
            "hit": c["cache_hit_tokens"] / max(c["cache_query_tokens"], 1),
            "us_per_step": 1e6 * cpu / max(c["forward_steps"], 1)}


def lpm_pass(a: argparse.Namespace, prompts: list[list[int]]) -> None:
    """One LPM scheduling pass alone: ``--concurrency`` waiting requests of the workload
    against a tree holding every group's prefix (a finished request of each group)."""
    from sgdsl.runtime.cache.radix import RadixCache
    from sgdsl.runtime.scheduler.memory import KVMemory
    from sgdsl.runtime.scheduler.policy import SchedulePolicy
    from sgdsl.runtime.scheduler.req import Req

    pool = TokenKVPool(a.max_total_tokens * 4, 1, 1, 1, torch.float32, "cpu")
    tree = RadixCache(pool)
    memory = KVMemory(ReqToTokenPool(4, 8, "cpu"), pool, tree)
    seen = set()
    for ids in prompts:
        if tuple(ids[: a.system_prompt_len]) not in seen:
            seen.add(tuple(ids[: a.system_prompt_len]))
            tree.insert(ids, pool.alloc(len(ids)))
    sp = SamplingParams(max_new_tokens=a.output_len)
    waiting = [Req(str(i), ids, sp, arrival=i) for i, ids in enumerate(prompts[: a.concurrency])]
    policy = SchedulePolicy("lpm", memory)
    cpu = time.process_time()
    policy.order(waiting)
    first = time.process_time() - cpu
    cpu = time.process_time()
    for _ in range(20):
        policy.order(waiting)
    print(f"LPM pass over {len(waiting)} waiting: {50 * (time.process_time() - cpu):.2f} ms "
          f"CPU (the first pass: {1000 * first:.2f} ms)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=24)
    ap.add_argument("--prompts-per-group", type=int, default=16)
    ap.add_argument("--system-prompt-len", type=int, default=2048)
    ap.add_argument("--question-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--max-total-tokens", type=int, default=60_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", default=None, help="cProfile the last round into this file")
    ap.add_argument("--lpm-pass", action="store_true", help="time one LPM pass alone")
    a = ap.parse_args()
    torch.set_num_threads(1)
    prompts = workload(a)
    if a.lpm_pass:
        for _ in range(a.rounds):
            lpm_pass(a, prompts)
        return
    for r in range(a.rounds):
        prof = cProfile.Profile() if a.profile and r == a.rounds - 1 else None
        if prof is not None:
            prof.enable()
        out = run(a, prompts)
        if prof is not None:
            prof.disable()
            prof.dump_stats(a.profile)
        print(f"round {r}: scheduler host CPU {out['cpu_ms_per_req']:.3f} ms/request, "
              f"{out['us_per_step']:.0f} us/step ({out['steps']} steps, {out['extends']} "
              f"extends, {out['retractions']} retractions, hit {out['hit']:.1%}, "
              f"wall {out['wall_s']:.1f} s)", flush=True)
    if a.profile:
        pstats.Stats(a.profile).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
