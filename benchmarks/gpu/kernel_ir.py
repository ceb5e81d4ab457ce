"""The LLVM IR a Triton kernel compiles to for a GPU, made on any machine (no GPU, no ptxas):
to check that a refactor of a kernel (a loop body moved into a ``triton.jit`` helper, a helper
shared by two kernels) leaves the generated code as it was. Debug info is dropped, so moved
lines do not count as changes.

    python benchmarks/gpu/kernel_ir.py --tree OLD_CHECKOUT runtime.kernels.decode_attention:_decode_stage1 \\
        --types Q=*bf16 K_Buf=*bf16 V_Buf=*bf16 Mid_o=*fp32 Mid_lse=*fp32 sm_scale=fp32 \\
        v_scale=fp32 Req_to_token=*i64 Req_idx=*i64 Seq_lens=*i64 Starts=*i64 Num_splits=*i64 \\
        --consts KV_GROUP=4 BLOCK_H=16 BLOCK_N=32 BLOCK_D=128 HEAD_DIM=128 MAX_SPLITS=8 \\
        PRECISION=tf32 HAS_STARTS=0 SPLITS_IN_KERNEL=1 PRE_KV=1 PDL=0 > old.ll
    # the same with --tree . > new.ll; diff old.ll new.ll

Parameters not named in --types are i32; --consts values are ints where they parse as ints.
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import sys


def _value(text: str) -> int | str:
    try:
        return int(text)
    except ValueError:
        return text


def llvm_ir(fn, types: dict[str, str], consts: dict[str, int | str], arch: int,
            num_warps: int, num_stages: int) -> str:
    """``fn``'s LLVM IR for ``cuda`` compute capability ``arch``, without debug info."""
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.compiler.compiler import ASTSource

    backend = CUDABackend(GPUTarget("cuda", arch, 32))
    options = backend.parse_options({"num_warps": num_warps, "num_stages": num_stages})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    signature = {n: "constexpr" if n in consts else types.get(n, "i32") for n in fn.arg_names}
    module = ASTSource(fn, signature, consts).make_ir(
        backend.target, options, backend.get_codegen_implementation(options),
        backend.get_module_map(), context)
    meta: dict = {}
    for stage in (backend.make_ttir, backend.make_ttgir):
        module = stage(module, meta, options, arch)
    text = backend.make_llir(module, meta, options, arch)
    lines = [re.sub(r",? !dbg !\d+", "", line) for line in text.splitlines()
             if not line.startswith("!") and "#dbg_" not in line and "llvm.dbg." not in line]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kernel", help="module:function, e.g. runtime.kernels.gemv_pairs:_pairs_kernel")
    ap.add_argument("--tree", default=".", help="the checkout to import the module from")
    ap.add_argument("--types", nargs="*", default=[], help="NAME=TYPE (*bf16, *fp8e4nv, fp32...)")
    ap.add_argument("--consts", nargs="*", default=[], help="NAME=VALUE of constexpr parameters")
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--num-warps", type=int, default=4)
    ap.add_argument("--num-stages", type=int, default=2)
    a = ap.parse_args()
    os.environ.pop("TRITON_INTERPRET", None)  # the interpreter's functions do not compile
    sys.path.insert(0, os.path.abspath(a.tree))
    module, name = a.kernel.split(":")
    fn = getattr(importlib.import_module(module), name)
    types = dict(t.split("=", 1) for t in a.types)
    consts = {k: _value(v) for k, v in (c.split("=", 1) for c in a.consts)}
    sys.stdout.write(llvm_ir(fn, types, consts, a.arch, a.num_warps, a.num_stages))


if __name__ == "__main__":
    main()
