"""CPU decode kernels in C, compiled with the system C compiler on first use and called through
ctypes (see ``cpu_kernels_src.py`` for the source).

Why: a batch-1 decode step of a small model on a few CPU cores is ~20 ms of memory-bound
matmuls plus, in eager torch, ~10 ms of per-op dispatch over ~20 tiny ops per layer (norms,
rotary, KV writes, attention, activation). These kernels do the glue between two matmuls in one
call each, and ``matvec`` streams the weights of a few-row product faster than MKL on some
CPUs (see ``matvec_preferred``). Plain C with no torch headers builds in about a second (a
torch C++ extension takes a minute), so a fresh machine pays almost nothing.

The library lives in ``<sgdsl cache>/cpu_kernels/<hash>.so``; the hash covers the source, the
flags, the compiler and the CPU model (``-march=native``). ``load()`` returns None, after one
warning, when no compiler is available or ``SGDSL_DISABLE_CPU_KERNELS=1``; callers then use
the torch path.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from .cpu_kernels_src import SOURCE

logger = logging.getLogger(__name__)

# NOTE: -fopenmp links libgomp.so.1, which resolves to the copy torch already loaded, so the
# kernels share torch's OpenMP thread pool. No -ffast-math: with gcc < 13 a shared library built with it sets flush-to-zero for the
# whole process at load time. These flags allow what the kernels need (vectorized reductions,
# fma) and nothing that changes NaN/denormal behaviour elsewhere.
CFLAGS = ["-O3", "-march=native", "-fPIC", "-shared", "-fopenmp", "-fno-math-errno", "-fno-trapping-math",
          "-fassociative-math", "-fno-signed-zeros", "-ffp-contract=fast"]
DISABLE_ENV = "SGDSL_DISABLE_CPU_KERNELS"
MATVEC_ENV = "SGDSL_CPU_MATVEC"  # "c" or "mkl": overrides matvec_preferred()
# Up to this many rows go through ``matvec`` (where preferred); more use MKL's gemm, which is
# compute-efficient once each weight element meets many rows.
MATVEC_MAX_ROWS = 8

_P = ctypes.c_void_p
_I = ctypes.c_int64
_F = ctypes.c_float


class DecodeStep(ctypes.Structure):
    """Per-forward parameters shared by every layer's ``decode_attention`` call (mirrors the C
    struct; pointers are raw addresses of contiguous tensors that outlive the forward)."""

    _fields_ = [("n", _I), ("heads", _I), ("kv_heads", _I), ("head_dim", _I),
                ("rtt_stride", _I), ("positions", _P), ("out_loc", _P), ("rows", _P),
                ("seq_lens", _P), ("rtt", _P), ("cos_tab", _P), ("sin_tab", _P),
                ("qkv_rows", _P), ("scores", _P), ("threads", _I), ("parallel_min_keys", _I),
                ("scale", _F), ("norm_eps", _F)]


_SIGNATURES = {
    # x, x_splits, res, w, out, n, d, eps, tmp
    "add_rmsnorm": [_P, _I, _P, _P, _P, _I, _I, _F, _P],
    # gate_up, splits, out, n, d, tmp
    "silu_mul": [_P, _I, _P, _I, _I, _P],
    # step, qkv, qkv_splits, bias, q_norm, k_norm, k_buf, v_buf, out
    "decode_attention": [ctypes.POINTER(DecodeStep), _P, _I, _P, _P, _P, _P, _P, _P],
    # x, n, w, y, splits, in, blk
    "matvec": [_P, _I, _P, _P, _I, _I, _I],
}


class CpuKernels:
    """The loaded library with typed entry points (``add_rmsnorm``, ``silu_mul``,
    ``decode_attention``, ``matvec``); arguments are raw pointers and ints (see the C source)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        lib = ctypes.CDLL(str(path))
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, None
            setattr(self, name, fn)
        self._lib = lib  # keep the handle alive


def matvec_preferred() -> bool:
    """Whether single-row projections should use the C ``matvec`` rather than MKL's gemm.

    NOTE: measured per step of SmolLM2-135M's matmuls (fp32, 540 MB), C vs MKL: on the 2-core
    AMD EPYC dev box 22.7 vs 31.8 ms at 1 thread (the C kernel keeps 4 read streams in flight
    per core); on 2 pinned cores of an idle Intel Xeon 19.8 vs 18.5 ms at 2 threads and 38.5 vs
    35.6 at 1. So C on AMD, MKL elsewhere; a fixed rule, not a timing at startup, so the
    rounding (and thus greedy output) of a machine never depends on its load."""
    choice = os.environ.get(MATVEC_ENV, "").lower()
    if choice in ("c", "mkl"):
        return choice == "c"
    return "AuthenticAMD" in _cpu_line("vendor_id")


def _cpu_line(key: str) -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(key):
                return line
    except OSError:
        pass
    return ""


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


def _cpu_id() -> str:
    """Identifies the instruction set ``-march=native`` targets (the cache may be shared)."""
    return _cpu_line("model name") + _cpu_line("flags") or platform.processor() or platform.machine()


def _build(cc: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src = Path(tmp) / "kernels.c"
        src.write_text(SOURCE)
        out = Path(tmp) / target.name
        subprocess.run([cc, *CFLAGS, str(src), "-o", str(out), "-lm"], check=True,
                       capture_output=True, text=True, timeout=120)
        os.replace(out, target)  # atomic: concurrent builders never see a partial file


@functools.lru_cache(maxsize=1)
def load() -> CpuKernels | None:
    """The compiled kernels, building them on first use; None when unavailable."""
    if os.environ.get(DISABLE_ENV) == "1":
        return None
    cc = _compiler()
    if cc is None:
        logger.warning("no C compiler found: CPU decode uses the (slower) torch path")
        return None
    from ..model.embedded import cache_root

    key = hashlib.sha256("\0".join([SOURCE, *CFLAGS, cc, _cpu_id()]).encode()).hexdigest()[:16]
    target = cache_root() / "cpu_kernels" / f"kernels-{key}.so"
    try:
        if not target.exists():
            _build(cc, target)
        return CpuKernels(target)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        logger.warning("building CPU kernels failed, using the torch path: %s", detail)
        return None
