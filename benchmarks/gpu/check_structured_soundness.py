"""Issue 29 item 4 on the device: constrained outputs of a random-weights model stay valid UTF-8
and within their bounds with jump-forward and forced completion each on or off.

One Engine per configuration (Llama-3.1-8B dummy weights by default, the 5-field person schema
of ``bench_structured_decode.py``, sampled at temperature 1.0, one seed per request), every
request submitted on its own (``async_generate``) so one failure cannot hide the others.
Per configuration it counts outputs whose token bytes are not valid UTF-8 (a request cut by
its budget may end inside a character), texts holding U+FFFD, finished values that fail the
schema (the backstop's ``ConstraintViolationError``, or jsonschema here) and other errors.
Any non-zero count in those columns is a bug. The H100 report this checks: with both off,
``'( pausedARP Dod\\ufffd\\ufffd\\ufffd\\ufffdSem−' is too long`` (maxLength 20).

    source benchmarks/gpu/device_env.sh && python3 benchmarks/gpu/check_structured_soundness.py
    python benchmarks/gpu/check_structured_soundness.py --device cpu --tiny --batch 16  # smoke
"""
from __future__ import annotations

import argparse
import asyncio
import codecs
import itertools
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_structured_decode import SCHEMA  # noqa: E402
from common import CONFIGS, print_table, random_prompts, tiny_model_dir  # noqa: E402

COLUMNS = ["backend", "jump", "forced", "requests", "stop", "length", "invalid utf8",
           "U+FFFD", "schema violations", "other errors"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-config", default=str(CONFIGS / "llama-3.1-8b"))
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--tiny", action="store_true", help="the config shrunk to 2 small layers")
    ap.add_argument("--backends", nargs="+", default=["xgrammar", "outlines"])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--temperature", type=float, default=1.0)
    return ap.parse_args(argv)


def model_dir(a: argparse.Namespace) -> str:
    return tiny_model_dir(a.model_config) if a.tiny else a.model_config


def check(a: argparse.Namespace, backend: str, jump: bool, forced: bool) -> list[Any]:
    import jsonschema

    from sgdsl.runtime import Engine
    from sgdsl.runtime.errors import ConstraintViolationError
    from sgdsl.runtime.grammar.vocab import token_bytes

    kw = dict(model=model_dir(a), load_format="dummy", device=a.device,
              max_running_requests=a.batch, context_length=a.prompt_len + a.max_new + 64,
              grammar_backend=backend, disable_jump_forward=not jump,
              disable_forced_completion=not forced, grammar_compile_timeout_s=300.0)
    counts = dict.fromkeys(COLUMNS[4:], 0)
    with Engine(**kw) as engine:
        tb = token_bytes(engine.tokenizer, len(engine.tokenizer))
        prompts = random_prompts(a.batch, a.prompt_len, seed=0)

        async def one(i: int) -> Any:
            params = {"json_schema": json.dumps(SCHEMA), "max_new_tokens": a.max_new,
                      "temperature": a.temperature, "seed": i}
            return await engine.async_generate(input_ids=prompts[i], sampling_params=params)

        async def run() -> list[Any]:
            return await asyncio.gather(*(one(i) for i in range(a.batch)),
                                        return_exceptions=True)
        for out in asyncio.run(run()):
            if isinstance(out, ConstraintViolationError):
                counts["schema violations"] += 1
                print("  violation:", str(out)[:300])
                continue
            if isinstance(out, BaseException):
                counts["other errors"] += 1
                print("  error:", repr(out)[:300])
                continue
            finish = out["meta_info"]["finish_reason"]["type"]
            counts[finish if finish in ("stop", "length") else "other errors"] += 1
            data = b"".join((tb[t] if t < len(tb) else None) or b"" for t in out["output_ids"])
            try:
                codecs.getincrementaldecoder("utf-8")().decode(data, final=finish == "stop")
            except UnicodeDecodeError as e:
                counts["invalid utf8"] += 1
                print("  invalid utf8:", e, data[:120])
            counts["U+FFFD"] += "\ufffd" in out["text"]
            if finish == "stop":
                try:
                    jsonschema.validate(json.loads(out["text"]), SCHEMA)
                except (ValueError, jsonschema.ValidationError) as e:
                    counts["schema violations"] += 1
                    print("  invalid value:", str(e)[:300])
    return [backend, jump, forced, a.batch, *counts.values()]


def main() -> None:
    a = parse_args()
    rows = [check(a, backend, jump, forced) for backend, jump, forced
            in itertools.product(a.backends, (True, False), (True, False))]
    print_table(f"Constrained soundness, every configuration (batch {a.batch}, "
                f"temperature {a.temperature}, max_new {a.max_new})", COLUMNS, rows)


if __name__ == "__main__":
    main()
