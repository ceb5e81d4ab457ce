"""Issue 25 row (b) replayed at a device's step costs, on the CPU: what the speculative cost gate
(runtime/speculative/cost.py) decides on the copy prompts when a plain step, a steady
speculative step and a first speculative step after plain ones take given times.

The greedy outputs of ``bench_speculative_real.py``'s copy prompts are recorded once with the
embedded model (plain Engine, CPU; ``--record``, a few minutes), then replayed by the
scheduler's stand-in model (tests/runtime/scheduler/standin.py) answering with the recorded
tokens: the real Scheduler, SpecDecoder, NGRAM drafter and gate run, and a fake clock advances
by the given costs per forward (the gate reads it). Printed per prompt and in all: the ratio
to plain decoding (every token a plain step) with the gate on, with it off, and the bound of a
clairvoyant choice per position (the NGRAM acceptance known in advance: no gate can do
better at those costs). The figures are the model's, not a measurement: only the decisions are
the runtime's own.

    python benchmarks/gpu/spec_gate_replay.py --record /tmp/spec_copy.json   # once
    python benchmarks/gpu/spec_gate_replay.py --outputs /tmp/spec_copy.json --plain 0.70 \\
        --spec 1.95 --first 0.85   # the H200's ms of 2026-11-28 (tree a01b438)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests" / "runtime"), str(Path(__file__).parent)]


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--outputs", default="/tmp/spec_copy.json")
    ap.add_argument("--record", default=None, help="record the outputs to this file and exit")
    ap.add_argument("--out-len", type=int, default=256)
    ap.add_argument("--plain", type=float, default=0.70, help="a plain step (ms)")
    ap.add_argument("--spec", type=float, default=1.95, help="a steady speculative step (ms)")
    ap.add_argument("--first", type=float, default=0.85,
                    help="extra of the first speculative step after plain ones (ms)")
    ap.add_argument("--refill", type=float, default=0.3,
                    help="extra of the first plain step after a speculative one (ms)")
    ap.add_argument("--draft-tokens", type=int, default=4)
    return ap.parse_args()


def record(path: str, out_len: int) -> None:
    from transformers import AutoTokenizer

    from sgdsl.runtime import Engine
    from sgdsl.runtime.config import EngineConfig
    from sgdsl.runtime.model.loader import resolve_model_dir
    from spec_real_prompts import COPY_PROMPTS

    tok = AutoTokenizer.from_pretrained(str(resolve_model_dir(EngineConfig())))
    rows = []
    with Engine(device="cpu", max_running_requests=4) as engine:
        for prompt in COPY_PROMPTS:
            out = engine.generate(prompt, {"max_new_tokens": out_len, "temperature": 0.0})
            rows.append({"prompt_ids": tok(prompt)["input_ids"], "output_ids": out["output_ids"]})
            print(f"recorded {len(out['output_ids'])} tokens", flush=True)
    Path(path).write_text(json.dumps(rows))


def acceptance(row: dict, k: int) -> list[int]:
    """Per output position, the draft tokens NGRAM's proposal there would get accepted."""
    from sgdsl.runtime.config import EngineConfig
    from sgdsl.runtime.speculative.ngram import NgramDrafter

    drafter, ids, out = NgramDrafter(EngineConfig()), row["prompt_ids"], row["output_ids"]
    accepted = []
    for p in range(len(out)):
        tree = drafter.propose([SimpleNamespace(rid="r", all_ids=ids + out[:p])], k)[0]
        a = 0
        while a < len(tree) and p + a < len(out) and tree.tokens[a] == out[p + a]:
            a += 1
        accepted.append(a)
    return accepted


def clairvoyant(acc: list[int], a: argparse.Namespace) -> float:
    """The least time over every per-position choice (plain or speculative), switches paid."""
    n, inf = len(acc), float("inf")
    best = [[inf, inf] for _ in range(n + a.draft_tokens + 2)]  # [position][last kind]
    best[0][0] = 0.0
    for p in range(n):
        for kind in (0, 1):
            t = best[p][kind]
            if t < inf:
                best[p + 1][0] = min(best[p + 1][0], t + a.plain + a.refill * kind)
                step = min(acc[p] + 1, n - p)
                best[p + step][1] = min(best[p + step][1],
                                        t + a.spec + a.first * (1 - kind))
    return min(best[n])


def replay(rows: list[dict], a: argparse.Namespace, min_speedup: float) -> list[float]:
    """Each prompt's decode time on the fake clock, as the bench runs them (a warm-up batch,
    then each prompt alone, one gate for all)."""
    from scheduler.standin import Harness, StandInRunner
    from sgdsl.runtime.config import EngineConfig
    from sgdsl.runtime.scheduler.scheduler import Scheduler

    scripts = [(r["prompt_ids"], r["output_ids"]) for r in rows]

    class Replay(StandInRunner):
        def logits(self, seqs):
            out = torch.zeros(len(seqs), 49152)
            for i, seq in enumerate(seqs):
                for prompt, ids in scripts:
                    if seq[:len(prompt)] == prompt:
                        j = len(seq) - len(prompt)
                        out[i, ids[j] if j < len(ids) else 1] = 1.0
                        break
            return out

    runner = Replay(8192, max_reqs=8, context_len=2048)
    config = EngineConfig(speculative_algorithm="ngram",
                          speculative_num_draft_tokens=a.draft_tokens,
                          speculative_min_speedup=min_speedup)
    h = Harness(None, runner)  # type: ignore[arg-type]
    h.sched = Scheduler(runner, config, [0], None, h.send, init_new_token_ratio=0.7)
    spec, clock = h.sched.spec, SimpleNamespace(now=0.0, last="extend", verify=False)
    spec.cost.clock = lambda: clock.now
    forward, verify = runner.forward, spec._forward

    def timed(batch):
        if clock.verify:
            clock.now += a.spec + a.first * (clock.last == "plain")
            clock.last = "spec"
        elif batch.mode.name == "DECODE":
            clock.now += a.plain + a.refill * (clock.last == "spec")
            clock.last = "plain"
        else:
            clock.last = "extend"
        return forward(batch)

    def timed_verify(run, batch):
        clock.verify = True
        try:
            return verify(run, batch)
        finally:
            clock.verify = False

    runner.forward, spec._forward = timed, timed_verify
    for i, (prompt, ids) in enumerate(scripts):  # the bench's warm-up: all at once, 16 tokens
        h.submit(f"w{i}", prompt, max_new_tokens=16, ignore_eos=True)
    h.run()
    spent = []
    for i, (prompt, ids) in enumerate(scripts):
        for n in (1, len(ids)):
            h.submit(f"{n}-{i}", prompt, max_new_tokens=n, ignore_eos=True)
            t0 = clock.now
            h.run()
        assert h.outs[f"{len(ids)}-{i}"] == ids, "replay diverged"
        spent.append(clock.now - t0)
    h.check_idle()
    return spent


def main() -> None:
    a = parse_args()
    if a.record:
        record(a.record, a.out_len)
        return
    rows = json.loads(Path(a.outputs).read_text())
    plain = [(len(r["output_ids"]) - 1) * a.plain for r in rows]
    on, off = replay(rows, a, 1.0), replay(rows, a, 0.0)
    best = [clairvoyant(acceptance(r, a.draft_tokens), a) for r in rows]
    print(f"costs (ms): plain {a.plain}, speculative {a.spec} (+{a.first} first), "
          f"refill +{a.refill}; ratio to plain decoding:")
    print("| prompt | tokens | gate on | gate off | clairvoyant bound |")
    print("|---|---|---|---|---|")
    for i, r in enumerate(rows):
        print(f"| {i} | {len(r['output_ids'])} | {plain[i] / on[i]:.2f}x | "
              f"{plain[i] / off[i]:.2f}x | {plain[i] / best[i]:.2f}x |")
    print(f"| all | {sum(len(r['output_ids']) for r in rows)} | {sum(plain) / sum(on):.3f}x | "
          f"{sum(plain) / sum(off):.3f}x | {sum(plain) / sum(best):.3f}x |")


if __name__ == "__main__":
    main()
