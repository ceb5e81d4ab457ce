"""Shared helpers of the GPU benchmarks: model dirs carried in the repo, runner construction,
device facts, and the final table every script prints."""
from __future__ import annotations

import datetime
import os
import subprocess
import time
from pathlib import Path

import torch

CONFIGS = Path(__file__).resolve().parent / "configs"


def model_dir(name: str) -> str:
    """A carried config dir (config.json + stand-in tokenizer) for load_format='dummy'."""
    return str(CONFIGS / name)


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
