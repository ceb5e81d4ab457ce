"""Host time of a speculative (NGRAM) decode step against a plain one, per phase, on the CPU.

Issue 25 row (b): on the H200 a speculative step of the embedded SmolLM2-135M cost ~1.95 ms
against 0.70 ms for a plain decode step, while the device work of a 5-token verify is about
that of a 1-token decode: the difference is the host's work, which the speculative step does
not overlap with the device. This bench runs the real Scheduler in this process (no engine
processes) on copy-heavy work, batch 1, greedy, the cost gate off (every step that can draft
speculates), and times each phase of every speculative step (wrappers around the
SpecDecoder's methods and the functions it calls). Host time = the step's time less its device
work (the forward and the argmax: the device's on a GPU, compute on the CPU). A plain engine
runs the same prompts in the same run: its host time per decode step (launch + read less the
same device work) is the reference. Clock: this thread's CPU time (the scheduler runs in it;
a loaded box inflates wall time), ``--clock wall`` for perf_counter.

Models: the embedded SmolLM2-135M on the copy prompts of ``bench_speculative_real.py``
(default), the tiny random Llama (``--tiny``), or no model (``--standin``: the scheduler tests'
stand-in answering as a copy of its prompt; the best proxy of a GPU's host, since a CPU forward
evicts the host's caches between the phases, which a device's forward does not).

    python benchmarks/bench_spec_host.py --tiny            # tiny random Llama (2 layers)
    python benchmarks/bench_spec_host.py --out-len 96      # the embedded SmolLM2-135M
    python benchmarks/bench_spec_host.py --standin --prompts 4 --out-len 256
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE / "gpu")]


class Phases:
    """Inclusive ns per phase label and calls, from wrappers installed on objects. A
    ``device`` label (the forward, the argmax: compute on the CPU, the device's on a GPU) is
    also summed per enclosing ``scope`` label (``device in <scope>``)."""

    def __init__(self, clock: Callable[[], int]) -> None:
        self.ns: dict[str, int] = defaultdict(int)
        self.calls: dict[str, int] = defaultdict(int)
        self.scope = "other"
        self.clock = clock

    def wrap(self, owner: Any, name: str, label: str | None = None, scope: bool = False,
             device: bool = False) -> None:
        fn = getattr(owner, name, None)
        if fn is None:  # an older tree (a before/after run)
            return
        label = label or name
        clock = self.clock

        def timed(*args: Any, **kw: Any) -> Any:
            outer = self.scope
            if scope:
                self.scope = label
            t0 = clock()
            try:
                return fn(*args, **kw)
            finally:
                spent = clock() - t0
                self.ns[label] += spent
                self.calls[label] += 1
                self.scope = outer
                if device:
                    self.ns[f"device in {outer}"] += spent
        setattr(owner, name, timed)


def build(a: argparse.Namespace, spec: bool) -> tuple[Any, Any]:
    """(scheduler, the outputs dict it fills) on this process, as the scheduler process
    builds them."""
    from sgdsl.runtime.config import EngineConfig
    from sgdsl.runtime.ipc import messages as m
    from sgdsl.runtime.scheduler.process import _build, freeze_startup_objects

    if a.standin:
        return build_standin(a, spec)
    kw: dict = dict(device="cpu", num_threads=1, max_running_requests=4, context_length=2048,
                    grammar_backend="none", disable_overlap_schedule=a.no_overlap)
    if a.tiny:
        from tiny_llama import tiny_llama_dir
        kw.update(model=tiny_llama_dir(2048), load_format="dummy", max_total_tokens=8192)
    if spec:
        kw.update(speculative_algorithm="NGRAM", speculative_num_draft_tokens=a.draft_tokens,
                  speculative_min_speedup=0.0, speculative_min_accept_per_step=0.0)
    outs: dict = {}

    def send(msg: Any) -> None:
        if isinstance(msg, m.BatchTokenOut):
            for o in msg.outs:
                outs.setdefault(o.rid, []).extend(o.new_ids)
    sched, _ = _build(EngineConfig(**kw), send)
    freeze_startup_objects()  # as the scheduler process does (else full collections land in
    return sched, outs        # whichever phase allocates)


def build_standin(a: argparse.Namespace, spec: bool) -> tuple[Any, Any]:
    """The real Scheduler over the scheduler tests' stand-in model (the ids are its KV, read
    back through ``req_to_token``) answering as a copy: the prompt again from its start, one
    token in ``--deviate`` changed. No model compute pollutes the host's caches between the
    phases (on a GPU the device's work does not either)."""
    sys.path.insert(0, str(HERE.parent / "tests" / "runtime"))
    import torch
    from scheduler.standin import Harness, StandInRunner
    from sgdsl.runtime.config import EngineConfig
    from sgdsl.runtime.scheduler.process import freeze_startup_objects
    from sgdsl.runtime.scheduler.scheduler import Scheduler

    vocab, prompt_len, deviate = STANDIN_VOCAB, a.standin_prompt, a.deviate

    class Copy(StandInRunner):
        def logits(self, seqs: list[list[int]]) -> torch.Tensor:
            want = []
            for seq in seqs:
                j = len(seq) - prompt_len  # the output position sampled here
                tok = seq[j % prompt_len] if j >= 0 else 0
                want.append((tok + 1) % vocab if j % deviate == deviate - 1 else tok)
            out = torch.zeros(len(seqs), vocab)
            out[torch.arange(len(seqs)), torch.tensor(want)] = 1.0
            return out

    runner = Copy(16384, max_reqs=8, context_len=4096)
    kw: dict = dict(disable_overlap_schedule=a.no_overlap)
    if spec:
        kw.update(speculative_algorithm="NGRAM", speculative_num_draft_tokens=a.draft_tokens,
                  speculative_min_speedup=0.0, speculative_min_accept_per_step=0.0)
    h = Harness(None, runner)  # type: ignore[arg-type]
    h.sched = Scheduler(runner, EngineConfig(**kw), [vocab + 1], None, h.send)
    freeze_startup_objects()
    return h.sched, h.outs


STANDIN_VOCAB = 64


def instrument(sched: Any, phases: Phases) -> None:
    """Wrap the forward, the plain step's parts and every phase of the speculative step."""
    from sgdsl.runtime.layers import sampler
    from sgdsl.runtime.speculative import decoder

    phases.wrap(sched.runner, "forward", "forward (runner)", device=True)
    phases.wrap(sampler, "greedy_argmax", "argmax (plain)", device=True)
    phases.wrap(decoder, "greedy_argmax", "argmax (verify)", device=True)  # older trees
    try:
        from sgdsl.runtime.speculative import verify_sample
        phases.wrap(verify_sample, "greedy_argmax", "argmax (verify)", device=True)
        phases.wrap(decoder, "sample_verify", "_sample")
    except ImportError:  # an older tree: SpecDecoder._sample
        pass
    phases.wrap(sched, "_launch_decode", "decode launch", scope=True)
    phases.wrap(sched, "_read", "read", scope=True)
    phases.wrap(sched, "_finish_and_send", "outputs sent")
    spec = sched.spec
    if spec is None:
        return
    phases.wrap(spec, "launch", scope=True)
    for name in ("_gate", "_drafts", "_verify", "_forward", "_sample", "_accept",
                 "_sync_running", "_after_tokens"):  # (the last three: older trees)
        phases.wrap(spec, name)
    try:
        from sgdsl.runtime.speculative import accept_step
        phases.wrap(decoder, "accept_step", "_accept")
        phases.wrap(accept_step, "sync_running", "_sync_running")
        phases.wrap(accept_step, "after_tokens", "_after_tokens")
        for name in ("commit_kv", "append_emitted", "walk"):
            phases.wrap(accept_step, name)
    except ImportError:
        pass
    phases.wrap(spec.drafter, "propose", "propose (drafter)")
    phases.wrap(spec.drafter, "prefetch", "prefetch (drafter)")
    for name in ("build_verify", "commit_kv", "append_emitted", "walk", "expect_drafts",
                 "build_ahead"):
        phases.wrap(decoder, name)


def run(a: argparse.Namespace, spec: bool, prompts: list[list[int]]) -> dict:
    from sgdsl.runtime.ipc import messages as m
    from sgdsl.runtime.sampling_params import SamplingParams

    sched, outs = build(a, spec)
    sp = SamplingParams(max_new_tokens=a.out_len, temperature=0.0, ignore_eos=a.tiny or a.standin)

    def generate(rid: str, ids: list[int], n: int) -> None:
        sched.handle(m.TokenizedGenerateReq(rid, ids, SamplingParams(
            max_new_tokens=n, temperature=0.0, ignore_eos=a.tiny or a.standin), stream=True))
        while sched.step():
            pass
    for i, ids in enumerate(prompts):  # warm-up, and the prompts' KV into the radix cache
        generate(f"w{i}", ids, 4)
    phases = Phases(time.perf_counter_ns if a.clock == "wall" else time.thread_time_ns)
    instrument(sched, phases)
    steps0, t0 = sched.counters["forward_steps"], time.perf_counter_ns()
    for i, ids in enumerate(prompts):
        sched.handle(m.TokenizedGenerateReq(str(i), ids, sp, stream=True))
        while sched.step():
            pass
    wall = time.perf_counter_ns() - t0
    sched.memory.check_idle()
    res = {"phases": phases, "wall_ns": wall, "outs": [outs[str(i)] for i in range(len(prompts))],
           "steps": sched.counters["forward_steps"] - steps0}
    if spec:
        res["stats"] = sched.spec.stats_dict()
    return res


def table(plain: dict, spec: dict) -> None:
    """Per speculative step (and per plain decode step) the mean us of each phase."""
    ps, pp = spec["phases"], plain["phases"]
    steps = max(ps.calls["_verify"], 1)
    print(f"| phase (us per speculative step, {steps} verify steps) | us | share of host |")
    print("|---|---|---|")
    host_spec = (ps.ns["launch"] - ps.ns["device in launch"]) / steps / 1e3
    order = ["launch", "_gate", "expect_drafts", "_drafts", "propose (drafter)", "_verify",
             "build_verify", "_forward", "_sample", "prefetch (drafter)", "read",
             "outputs sent", "build_ahead", "_accept", "walk", "commit_kv", "append_emitted",
             "_sync_running", "_after_tokens"]
    for label in order:
        us = ps.ns[label] / steps / 1e3
        share = "" if label in ("launch", "_verify", "_forward", "_sample") \
            else f"{us / host_spec:.0%}"
        print(f"| {label} | {us:.1f} | {share} |")
    print(f"| device work (forward, argmax) | {ps.ns['device in launch'] / steps / 1e3:.1f} | |")
    print(f"| **host (launch less device work)** | **{host_spec:.1f}** | |")
    hidden = (ps.ns["prefetch (drafter)"] + ps.ns["read"] + ps.ns["build_ahead"]) / steps / 1e3
    print(f"| of it while the device verifies (prefetch, last outputs, next batch) | "
          f"{hidden:.1f} | |")
    print(f"| **serial host (the rest)** | **{host_spec - hidden:.1f}** | |")
    # a plain step's host time: its launch and its read, less the forward and the argmax
    n_plain = max(pp.calls["decode launch"], 1)
    dev = pp.ns["device in decode launch"] + pp.ns["device in read"]
    host_plain = (pp.ns["decode launch"] + pp.ns["read"] - dev) / n_plain / 1e3
    print(f"| plain decode step: host (launch + read less device work), {n_plain} steps | "
          f"{host_plain:.1f} | |")
    print(f"| plain decode step: device work | {dev / n_plain / 1e3:.1f} | |")
    print(f"speculative host / plain host per step: {host_spec / host_plain:.2f}; serial: "
          f"{(host_spec - hidden) / host_plain:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny random Llama instead of SmolLM2")
    ap.add_argument("--standin", action="store_true",
                    help="no model: the scheduler tests' stand-in answering as a copy")
    ap.add_argument("--standin-prompt", type=int, default=300, help="its prompt length")
    ap.add_argument("--deviate", type=int, default=23,
                    help="the stand-in's copy changes one token in this many")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--out-len", type=int, default=128)
    ap.add_argument("--draft-tokens", type=int, default=4)
    ap.add_argument("--no-overlap", action="store_true")
    ap.add_argument("--clock", default="thread", choices=["thread", "wall"],
                    help="thread: this thread's CPU time (steady on a loaded box; the "
                         "scheduler runs in it), wall: perf_counter")
    a = ap.parse_args()
    import torch
    torch.set_num_threads(1)
    from spec_real_prompts import COPY_PROMPTS
    from sgdsl.runtime.config import EngineConfig
    from sgdsl.runtime.model.loader import resolve_model_dir
    from sgdsl.runtime.tokenizer.loader import load_tokenizer

    if a.standin:
        import random
        rng = random.Random(0)
        prompts = [[rng.randrange(1, STANDIN_VOCAB) for _ in range(a.standin_prompt)]
                   for _ in range(a.prompts)]
    else:
        config = EngineConfig()
        tok = load_tokenizer(config, resolve_model_dir(config))
        prompts = [tok.encode(p) for p in COPY_PROMPTS[:a.prompts]]
    plain, spec = run(a, False, prompts), run(a, True, prompts)
    same = sum(x == y for x, y in zip(plain["outs"], spec["outs"]))
    tokens = sum(map(len, spec["outs"]))
    st = spec["stats"]
    model = "stand-in copy model" if a.standin else "tiny random Llama" if a.tiny \
        else "SmolLM2-135M"
    print(f"{model}, {len(prompts)} prompts x "
          f"{a.out_len}: greedy-equal {same}/{len(prompts)}; tokens {tokens}, verify steps "
          f"{st['spec_verify_steps']}, prefetched lookups taken "
          f"{st.get('spec_draft_prefetch_hits', '-')}, batches built ahead / taken "
          f"{st.get('spec_ahead_built', '-')} / {st.get('spec_ahead_taken', '-')} (launched "
          f"before the last was read: {st.get('spec_pipelined_steps', '-')}, wasted "
          f"{st.get('spec_ahead_wasted', '-')}), outputs "
          f"held {st.get('spec_outputs_held', '-')}, tokens per step {tokens / max(spec['steps'], 1):.2f} "
          f"(forward steps {spec['steps']} vs plain {plain['steps']}); wall spec/plain "
          f"{spec['wall_ns'] / 1e9:.2f}/{plain['wall_ns'] / 1e9:.2f} s")
    table(plain, spec)


if __name__ == "__main__":
    main()
