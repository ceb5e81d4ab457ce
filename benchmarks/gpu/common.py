"""Shared helpers of the GPU benchmarks: model dirs carried in the repo (and their tiny
copies for CPU dry runs), runner construction, device facts, and the final table every script
prints."""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import torch

CONFIGS = Path(__file__).resolve().parent / "configs"


def model_dir(name: str) -> str:
    """A carried config dir (config.json + stand-in tokenizer) for load_format='dummy'."""
    return str(CONFIGS / name)


# A config's layers shrunk for a CPU dry run (``--tiny``); its vocabulary and tokenizer stay.
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "torch_dtype": "float32"}


def tiny_model_dir(config_dir: str, overrides: dict | None = None) -> str:
    """A folder with ``config_dir``'s config at ``TINY`` size (plus ``overrides``) and links to
    its other files (the tokenizer), for load_format='dummy'."""
    src = Path(config_dir).resolve()
    config = {**json.loads((src / "config.json").read_text()), **TINY, **(overrides or {})}
    # NOTE: one folder per source folder and config: worktrees share /tmp, and links into a
    # worktree removed since dangle (they are made again)
    tag = hashlib.sha1(f"{src}{sorted(config.items())}".encode()).hexdigest()[:8]
    dst = Path(tempfile.gettempdir()) / f"sgdsl-tiny-{src.name}-{tag}"
    dst.mkdir(exist_ok=True)
    (dst / "config.json").write_text(json.dumps(config))
    for f in src.iterdir():
        link = dst / f.name
        if f.name != "config.json" and not link.exists():
            link.unlink(missing_ok=True)  # a dangling link
            link.symlink_to(f.resolve())
    return str(dst)


def device_line() -> str:
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=CONFIGS).stdout.strip() or os.environ.get("COMMIT", "?")
    return f"{datetime.date.today()} | {name} | torch {torch.__version__} | commit {commit}"


class Timer:
    """Wall clock around device work (synchronizes at both ends)."""

    def __enter__(self) -> "Timer":
        torch.cuda.synchronize()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        torch.cuda.synchronize()
        self.s = time.perf_counter() - self.t0


def print_table(title: str, header: list[str], rows: list[list]) -> None:
    cells = [header] + [[f"{c:.4g}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"\n## {title}\n{device_line()}")
    for i, r in enumerate(cells):
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


def random_prompts(n: int, lengths: list[int] | int, seed: int, vocab: int = 32000) -> list[list[int]]:
    """Seeded random token ids (below the stand-in tokenizer's vocab, so they detokenize)."""
    gen = torch.Generator().manual_seed(seed)
    lens = [lengths] * n if isinstance(lengths, int) else lengths
    return [torch.randint(10, vocab, (k,), generator=gen).tolist() for k in lens]


def run_engine(model: str, prompts: list[list[int]], out_lens: list[int] | int,
               **engine_kw) -> dict:
    """Submit every prompt at once (greedy, ignore_eos, fixed output lengths) through the
    Engine; returns wall time, token counts and the engine's stats after the run."""
    from sgdsl.runtime import Engine

    outs = [out_lens] * len(prompts) if isinstance(out_lens, int) else out_lens
    params = [{"max_new_tokens": o, "ignore_eos": True, "temperature": 0.0} for o in outs]
    engine_kw.setdefault("grammar_backend", "none")  # the GPU machine has no xgrammar
    with Engine(model=model_dir(model), load_format="dummy", **engine_kw) as engine:
        engine.generate(input_ids=prompts[:4], sampling_params=params[:4])  # warm-up
        engine.flush_cache()
        before = engine.stats()
        t0 = time.perf_counter()
        res = engine.generate(input_ids=prompts, sampling_params=params)
        wall = time.perf_counter() - t0
        stats = engine.stats()
    gen_tokens = sum(len(r["output_ids"]) for r in res)
    assert gen_tokens == sum(outs), "ignore_eos run produced the wrong number of tokens"
    hit = stats["cache_hit_tokens"] - before["cache_hit_tokens"]
    query = stats["cache_query_tokens"] - before["cache_query_tokens"]
    return {"wall_s": wall, "in_tokens": sum(map(len, prompts)), "out_tokens": gen_tokens,
            "hit_rate": hit / query if query else 0.0}


def time_decode(engine, ids: list[int], out_len: int) -> tuple[float, float]:
    """(seconds for a 1-token request, seconds per decoded token) of greedy requests on
    ``engine``: a 1-token and an ``out_len``-token run of the same prompt, both prefilling the
    whole prompt (cache flushed), the difference spread over the extra tokens."""
    params = lambda n: {"max_new_tokens": n, "ignore_eos": True, "temperature": 0.0}  # noqa: E731
    times = {}
    for n in (1, out_len):
        engine.flush_cache()
        t0 = time.perf_counter()
        out = engine.generate(input_ids=ids, sampling_params=params(n))
        times[n] = time.perf_counter() - t0
        assert len(out["output_ids"]) == n
    return times[1], (times[out_len] - times[1]) / (out_len - 1)


def replay_us(graph: "torch.cuda.CUDAGraph", warmup: int, replays: int) -> float:
    """Median microseconds of one replay of ``graph``, each timed between CUDA events, after
    ``warmup`` untimed replays."""
    import statistics

    for _ in range(warmup):
        graph.replay()
    ts = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)
