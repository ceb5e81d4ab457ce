"""``run_batch``'s own client-side cost, alone: the person programs (``person_programs.py``) on
``Local`` over an engine that answers at once (issue 29 item 1: the language paths' gap to the
Engine is what the client does before the batch leaves and after its answers come back).

The fake engine takes the coalesced list call, waits ``--engine-s`` (a GPU's batch time stands
in; the client is idle then) and answers every request with a fixed output (a valid person
object for the constrained program, as the sgdsl runtime's checked outputs look). Per mode,
medians over ``--rounds`` (the first round is a warm-up):

- ``sent ms``: from ``run_batch``'s call until the batch's (last) engine call has its prompts as
  token ids: the start phase (program states, bodies, requests built; with ``--tokenizer`` the
  prompts tokenized as the Engine's request builder does, else no tokenization);
- ``after ms``: from the engine's answer until ``run_batch`` returned every state: the result
  handling (results parsed, states filled, the caller woken);
- ``CPU ms/program``: this process's CPU over the whole call, per program;
- ``calls``: engine calls per batch (1: the batch went as one).

    OMP_NUM_THREADS=1 python benchmarks/bench_lang_client.py --batches 32 256 --rounds 20
    OMP_NUM_THREADS=1 python benchmarks/bench_lang_client.py --tokenizer \
        benchmarks/gpu/configs/llama-3.1-8b        # + the Engine's tokenization of the batch
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from person_programs import person_programs  # noqa: E402

PERSON = '{"name": "Ada", "age": 36, "city": "London", "occupation": "engineer", "is_employed": true}'


class InstantEngine:
    """What ``Local`` uses of an Engine: model/server info and ``async_generate``."""

    model_info = {"model_path": "fake", "served_model_name": "fake", "context_length": 4096,
                  "eos_token_ids": [2], "chat_template": None}

    def __init__(self, engine_s: float, tokenizer: Any = None) -> None:
        self.engine_s = engine_s
        self.calls: list[float] = []  # perf_counter of each call, its prompts ready as ids
        self.answered = 0.0
        self.tokenizer, self.mm_processor = tokenizer, None
        self._encode = None
        if tokenizer is not None:
            from sgdsl.runtime.tokenizer.encoder import ids_batch_encoder

            self._encode = ids_batch_encoder(tokenizer)

    def server_info(self) -> dict[str, Any]:
        return {"grammar_backend": "xgrammar"}

    def flush_cache(self) -> bool:
        return True

    async def async_generate(self, prompt: Any = None, sampling_params: Any = None,
                             rid: Any = None, **_: Any) -> Any:
        if self._encode is not None:  # the Engine's request builder: one call for the list
            self._encode(prompt if isinstance(prompt, list) else [prompt])
        self.calls.append(time.perf_counter())
        await asyncio.sleep(self.engine_s)
        if isinstance(prompt, list):
            outs = [self._out(sp, r) for sp, r in zip(sampling_params, rid)]
        else:
            outs = self._out(sampling_params, rid)
        self.answered = time.perf_counter()
        return outs

    @staticmethod
    def _out(sp: dict[str, Any], rid: str) -> dict[str, Any]:
        n = sp["max_new_tokens"]
        meta: dict[str, Any] = {"id": rid, "finish_reason": {"type": "stop", "matched": 2},
                                "prompt_tokens": 296, "completion_tokens": n,
                                "cached_tokens": 0, "e2e_latency": 1.0}
        text = "x" * n
        if "json_schema" in sp:  # as the sgdsl runtime answers a constrained request
            meta["forced_token_positions"] = [1, 2, 3]
            text = PERSON
        return {"text": text, "output_ids": list(range(n)), "meta_info": meta}


def run(a: argparse.Namespace) -> list[list[Any]]:
    from sgdsl.backends import Local

    tokenizer = None
    if a.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(a.tokenizer)
    engine = InstantEngine(a.engine_s, tokenizer)
    local = Local(engine=engine)
    programs = dict(zip(("json", "free"), person_programs()))
    rows = []
    for bs in a.batches:
        batch = [{"prompt": f"Describe person {i} as JSON. " + "lorem ipsum " * 120, "budget": 40}
                 for i in range(bs)]
        got: dict[str, list[tuple[float, float, float, int]]] = {}
        for r in range(a.rounds + 1):  # round 0: warm-up
            for mode in (("json", "free") if r % 2 else ("free", "json")):
                run = one_run(engine, local, programs[mode], batch)
                if r:
                    got.setdefault(mode, []).append(run)
        for label, runs in got.items():
            med = [statistics.median(x[k] for x in runs) for k in range(4)]
            rows.append([bs, label, f"{1e3 * med[0]:.1f}", f"{1e3 * med[1]:.1f}",
                         f"{1e3 * med[2] / bs:.3f}", f"{med[3]:.0f}"])
    return rows


def one_run(engine: InstantEngine, local: Any, program: Any, batch: list[dict[str, Any]]
            ) -> tuple[float, float, float, int]:
    """(batch sent after, returned after the answers, CPU seconds, engine calls)."""
    engine.calls.clear()
    cpu0, t0 = time.process_time(), time.perf_counter()
    states = program.run_batch(batch, backend=local)
    for s in states:
        if s.error() is not None:
            raise s.error()
    t1, cpu = time.perf_counter(), time.process_time() - cpu0
    return engine.calls[-1] - t0, t1 - engine.answered, cpu, len(engine.calls)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[32, 256])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--engine-s", type=float, default=0.05,
                    help="seconds the fake engine takes per call")
    ap.add_argument("--tokenizer", default=None,
                    help="a tokenizer folder: the fake engine then tokenizes the text prompts "
                         "as the Engine's request builder does before sending")
    a = ap.parse_args()
    rows = run(a)
    print(f"\n## run_batch on Local over an instant engine (median of {a.rounds} rounds)")
    print("| batch | mode | sent ms | after ms | CPU ms/program | calls |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(x) for x in row) + " |")


if __name__ == "__main__":
    main()
