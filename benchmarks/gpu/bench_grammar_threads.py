"""Host cost of one constrained step's grammar work at a batch size, by thread count: xgrammar's
batch bitmask fill (its own thread pool) and batch token accept (chunks on a Python thread
pool, native code without the GIL), 256 matchers of the structured-decode benchmark's schema
walking one JSON text token by token; and the two per row share on one thread each
(``pipelined``: no barrier between accept and fill). Tells whether the host's cores
actually run in parallel (a CPU quota below ``os.cpu_count()`` shows as no gain past it).

    python benchmarks/gpu/bench_grammar_threads.py --batch 256 --threads 1 2 4 8 16
"""
from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bench_structured_decode as bench
from common import device_line, model_dir, print_table

TEXT = ('{"name": "Ada Lovelace", "age": 36, "city": "London", "occupation": "engineer", '
        '"is_employed": true}')


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--model", default="llama-3.1-8b")
    a = ap.parse_args()
    import xgrammar as xgr
    from transformers import AutoTokenizer

    print(device_line(), f"| os.cpu_count {os.cpu_count()} | sched_getaffinity "
          f"{len(os.sched_getaffinity(0))}")
    tok = AutoTokenizer.from_pretrained(model_dir(a.model))
    vocab = json.loads(Path(model_dir(a.model), "config.json").read_text())["vocab_size"]
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab)
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(bench.SCHEMA),
                                                              any_whitespace=False)
    ids = tok.encode(TEXT, add_special_tokens=False)
    rows = []
    for threads in a.threads:
        matchers = [xgr.GrammarMatcher(compiled) for _ in range(a.batch)]
        filler = xgr.BatchGrammarMatcher(threads)
        pool = ThreadPoolExecutor(threads)
        bitmask = xgr.allocate_token_bitmask(a.batch, vocab)
        chunk = -(-a.batch // threads)
        spans = range(0, a.batch, chunk)
        t_fill = t_acc = 0.0
        for t in ids:
            t0 = time.perf_counter()
            filler.batch_fill_next_token_bitmask(matchers, bitmask)
            t1 = time.perf_counter()
            toks = [t] * a.batch
            if threads == 1:
                xgr.BatchGrammarMatcher.batch_accept_token(matchers, toks)
            else:
                list(pool.map(lambda i: xgr.BatchGrammarMatcher.batch_accept_token(
                    matchers[i:i + chunk], toks[i:i + chunk]), spans))
            t2 = time.perf_counter()
            t_fill, t_acc = t_fill + t1 - t0, t_acc + t2 - t1
        # pipelined: each thread accepts then fills its own share of the rows (no barrier
        # between the phases, one single-threaded filler per thread)
        matchers = [xgr.GrammarMatcher(compiled) for _ in range(a.batch)]
        fillers = [xgr.BatchGrammarMatcher(1) for _ in range(threads)]

        def share(k: int, toks: list[int]) -> None:
            lo, hi = k * chunk, min(a.batch, (k + 1) * chunk)
            xgr.BatchGrammarMatcher.batch_accept_token(matchers[lo:hi], toks[lo:hi])
            fillers[k].batch_fill_next_token_bitmask(matchers[lo:hi], bitmask,
                                                      list(range(lo, hi)))
        t_pipe = 0.0
        for t in ids:
            toks = [t] * a.batch
            t0 = time.perf_counter()
            list(pool.map(lambda k: share(k, toks), range(len(spans))))
            t_pipe += time.perf_counter() - t0
        pool.shutdown()
        n = len(ids)
        rows.append([threads, f"{1e3 * t_fill / n:.2f}", f"{1e3 * t_acc / n:.2f}",
                     f"{1e3 * (t_fill + t_acc) / n:.2f}", f"{1e3 * t_pipe / n:.2f}"])
        print(rows[-1], flush=True)
    print_table(f"grammar host work per step, batch {a.batch} (ms)",
                ["threads", "batch fill", "batch accept", "sum", "pipelined accept+fill"],
                rows)


if __name__ == "__main__":
    main()
