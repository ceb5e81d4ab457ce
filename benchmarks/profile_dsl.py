"""Timeline of one ``bench_dsl_overhead`` pass: when the Local backend's coalescer sends each
group of requests to the Engine and when they come back, relative to the ``run_batch`` call.
Shows how much of the DSL's extra time is before the first request reaches the engine, between
groups, and after the last result.

    python benchmarks/profile_dsl.py [--model ... --load-format dummy --grammar-backend none]
"""
from __future__ import annotations

import argparse
import time

from bench_dsl_overhead import prompts, time_dsl, time_engine
from sgdsl.backends import Local, coalescer
from sgdsl.runtime import Engine

_EVENTS: list[tuple[str, int, float]] = []
_T0 = [0.0]


def _instrument() -> None:
    send = coalescer.Coalescer._send

    async def timed_send(self: coalescer.Coalescer, items: list) -> None:
        _EVENTS.append(("send", len(items), time.perf_counter() - _T0[0]))
        try:
            return await send(self, items)
        finally:
            _EVENTS.append(("back", len(items), time.perf_counter() - _T0[0]))
    coalescer.Coalescer._send = timed_send


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--model", default=None)
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--grammar-backend", default="xgrammar")
    args = parser.parse_args()
    _instrument()
    engine = Engine(model=args.model, load_format=args.load_format,
                    grammar_backend=args.grammar_backend)
    try:
        backend = Local(engine=engine)
        texts = prompts(args.num)
        stop = tuple(backend.chat_template().stop_str)
        time_engine(engine, texts, 2, stop)
        time_dsl(backend, texts, 2)
        for _ in range(args.passes):
            e_time, _ = time_engine(engine, texts, args.max_tokens, stop)
            _EVENTS.clear()
            _T0[0] = time.perf_counter()
            d_time, _ = time_dsl(backend, texts, args.max_tokens)
            events = " ".join(f"{kind}:{n}@{t * 1e3:.1f}" for kind, n, t in _EVENTS)
            print(f"engine {e_time * 1e3:.1f} ms  dsl {d_time * 1e3:.1f} ms  "
                  f"ratio {d_time / e_time:.3f}  | {events}")
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
