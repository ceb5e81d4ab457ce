"""One rank of a model-level TP test (spawned by test_tp_models.py): joins a gloo group, builds
a ModelRunner per model directory and returns rank 0's logits (every rank: its KV pool shape).
Also the model-level tests' prompts and tiny checkpoints (test_tp_models, test_ep_models)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

DECODE_STEPS = 2
# token-id prompts of the model-level parallel tests (ids below the tiny models' vocab of 250)
PROMPTS = [[5, 17, 200, 3, 99, 42, 7], [11, 12], [249, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]]


def model_test_module(name: str):
    """A helper module of tests/runtime/model (not importable from this package)."""
    path = Path(__file__).resolve().parents[1] / "model" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"tp_test_{name}", path)
    if spec.name in sys.modules:
        return sys.modules[spec.name]
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while defining
    spec.loader.exec_module(module)
    return module


def tiny_model_dirs(tmp_path_factory, cases: dict[str, tuple[str, dict]]) -> list[str]:
    """One tiny random checkpoint per case (name: (kind, ``tiny_model`` overrides)) in a folder
    of its own; the folders, in the cases' order."""
    dirs = []
    for name, (kind, overrides) in cases.items():
        path = tmp_path_factory.mktemp(name)
        model_test_module("tiny").tiny_model(kind, path, **dict(overrides))
        dirs.append(str(path))
    return dirs


def logits_of(runner, prompts: list[list[int]], steps: int = DECODE_STEPS) -> list[torch.Tensor]:
    """Extend logits of every prompt's last token, then greedy decode steps."""
    d = model_test_module("driver").RunnerDriver(runner)
    reqs = [d.new_request() for _ in prompts]
    out = [d.extend(list(zip(reqs, prompts)))]
    for _ in range(steps):
        nxt = out[-1].argmax(-1).tolist()
        out.append(d.decode(list(zip(reqs, nxt))))
    return [t.clone() for t in out]


def run_rank(rank: int, size: int, init_method: str, dirs: list[str],
             prompts: list[list[int]], results) -> None:
    from sgdsl.runtime.config import EngineConfig
    from sgdsl.runtime.distributed.collectives import barrier
    from sgdsl.runtime.distributed.state import destroy_tp_group, init_tp_group
    from sgdsl.runtime.model.runner import ModelRunner

    torch.set_num_threads(1)
    init_tp_group(rank, size, torch.device("cpu"), init_method, timeout_s=120)
    try:
        for model_dir in dirs:
            runner = ModelRunner(EngineConfig(model=model_dir, device="cpu", max_total_tokens=256,
                                              max_running_requests=4, tp_size=size))
            logits = logits_of(runner, prompts)
            kv = tuple(runner.token_kv_pool.k_buffer[0].shape)
            # numpy: a torch tensor would travel as shared memory that dies with this process
            results.put((rank, model_dir, kv, [t.numpy() for t in logits] if rank == 0 else None))
        # NOTE: leave together: a rank tearing its gloo group down while a peer still ran
        # its last collective aborted one rank at exit ("terminate called without an active
        # exception") on a loaded 2-core CI box
        barrier(timeout_s=120)
    finally:
        destroy_tp_group()


def barrier_probe(rank: int, size: int, init_method: str, results) -> None:
    """Rank 1 'hangs' (never reaches the barrier); rank 0 reports what its barrier raised."""
    import time

    from sgdsl.runtime.distributed.collectives import barrier
    from sgdsl.runtime.distributed.state import init_tp_group

    init_tp_group(rank, size, torch.device("cpu"), init_method, timeout_s=60)
    if rank == 1:
        time.sleep(8)
        return
    try:
        barrier(timeout_s=1.0)
        results.put("no error")
    except Exception as e:  # noqa: BLE001 - the message is the result
        results.put(str(e))


def run_rank_custom_ar(rank: int, size: int, init_method: str, model_dir: str,
                       prompts: list[list[int]], results) -> None:
    """On GPU ``rank``, bf16: rank 0's logits with NCCL only, with torch's symmetric-memory
    kernels alone, and with the barrier-free kernel (its fused add + norm, the chained sums)."""
    import os

    from sgdsl.runtime.config import EngineConfig
    from sgdsl.runtime.distributed import custom_all_reduce
    from sgdsl.runtime.distributed.state import destroy_tp_group, get_tp_group, init_tp_group
    from sgdsl.runtime.model.runner import ModelRunner

    init_tp_group(rank, size, torch.device(f"cuda:{rank}"), init_method, timeout_s=120)
    try:
        for mode in ("nccl", "symm", "lamport"):
            custom_all_reduce.uninstall_all()
            os.environ["SGDSL_DISABLE_LAMPORT_ALL_REDUCE"] = "1" if mode == "symm" else "0"
            runner = ModelRunner(EngineConfig(
                model=model_dir, device="cuda", dtype="bfloat16", max_total_tokens=256,
                max_running_requests=4, tp_size=size, disable_custom_all_reduce=mode == "nccl"))
            logits = logits_of(runner, prompts)
            used = custom_all_reduce.lookup(get_tp_group())
            calls = dict(used.calls) if used is not None else {}
            results.put((rank, mode, calls,
                         [t.float().cpu().numpy() for t in logits] if rank == 0 else None))
            del runner, used
        _leave_custom_ar()
    finally:
        destroy_tp_group()


def _leave_custom_ar() -> None:
    """Free the peer-mapped buffers, then leave together."""
    import gc

    from sgdsl.runtime.distributed import custom_all_reduce
    from sgdsl.runtime.distributed.collectives import barrier

    # NOTE: free the peer-mapped buffers while the group's store is up: left to interpreter
    # exit, rank 1 tore them down after rank 0 (the store's host) had gone, and exited non-zero
    custom_all_reduce.uninstall_all()
    gc.collect()
    torch.cuda.synchronize()
    barrier(timeout_s=120)


def run_rank_pdl(rank: int, size: int, init_method: str, model_dir: str, prompt: list[int],
                 results) -> None:
    """On GPU ``rank``, bf16, the barrier-free all-reduce, batch-1 decode in CUDA graphs:
    rank 0's logits without PDL, with PDL on every converted kernel but the all-reduce, and on
    all of them (kernels/pdl.py)."""
    import os

    from sgdsl.runtime.config import EngineConfig
    from sgdsl.runtime.distributed import custom_all_reduce
    from sgdsl.runtime.distributed.state import destroy_tp_group, get_tp_group, init_tp_group
    from sgdsl.runtime.kernels import pdl
    from sgdsl.runtime.model.runner import ModelRunner

    init_tp_group(rank, size, torch.device(f"cuda:{rank}"), init_method, timeout_s=120)
    try:
        for mode in ("off", "kernels", "all"):
            custom_all_reduce.uninstall_all()
            os.environ["SGDSL_PDL_ALL_REDUCE"] = "1" if mode == "all" else "0"
            pdl.set_enabled(mode != "off")
            runner = ModelRunner(EngineConfig(
                model=model_dir, device="cuda", dtype="bfloat16", max_total_tokens=256,
                max_running_requests=4, tp_size=size))
            logits = logits_of(runner, [prompt], steps=8)
            used = custom_all_reduce.lookup(get_tp_group())
            calls = dict(used.calls) if used is not None else {}
            results.put((rank, mode, calls, pdl.enabled(logits[0]),
                         [t.float().cpu().numpy() for t in logits] if rank == 0 else None))
            del runner, used
        pdl.set_enabled(None)
        _leave_custom_ar()
    finally:
        destroy_tp_group()


# The TP decode chain's switches (tp-chain): as first built, and all on (kernels/pdl.py,
# kernels/lamport_all_reduce.py, layers/gemv_epilogue.py)
CHAIN_MODES = {
    "base": {"SGDSL_GEMV_EPILOGUE_TP": "0", "SGDSL_LAMPORT_SPIN": "serial",
             "SGDSL_LAMPORT_VEC": "0", "SGDSL_GEMV_PRE": "1", "SGDSL_GEMV_PAIRS_PRE": "1",
             "SGDSL_PDL_TRIGGER": "wait", "SGDSL_ATTN_PRE": "0"},
    "new": {"SGDSL_GEMV_EPILOGUE_TP": "1", "SGDSL_LAMPORT_SPIN": "all",
            "SGDSL_LAMPORT_VEC": "1", "SGDSL_GEMV_PRE": "4", "SGDSL_GEMV_PAIRS_PRE": "4",
            "SGDSL_PDL_TRIGGER": "early", "SGDSL_ATTN_PRE": "1"},
}


def run_rank_chain(rank: int, size: int, init_method: str, model_dir: str, prompt: list[int],
                   results) -> None:
    """On GPU ``rank``, bf16, the barrier-free all-reduce and PDL where supported, batch-1
    decode in CUDA graphs: rank 0's logits under each of ``CHAIN_MODES``, and how many qkv
    products ran with the rotary epilogue (eager calls)."""
    import os

    from sgdsl.runtime.config import EngineConfig
    from sgdsl.runtime.distributed import custom_all_reduce
    from sgdsl.runtime.distributed.state import destroy_tp_group, get_tp_group, init_tp_group
    from sgdsl.runtime.kernels import gemv_pairs
    from sgdsl.runtime.model.runner import ModelRunner

    init_tp_group(rank, size, torch.device(f"cuda:{rank}"), init_method, timeout_s=120)
    launch, ropes = gemv_pairs._launch, []

    def counted(epilogue, *args, **kwargs):
        ropes.append(epilogue)
        return launch(epilogue, *args, **kwargs)

    gemv_pairs._launch = counted
    try:
        for mode, env in CHAIN_MODES.items():
            custom_all_reduce.uninstall_all()
            os.environ.update(env)
            ropes.clear()
            runner = ModelRunner(EngineConfig(
                model=model_dir, device="cuda", dtype="bfloat16", max_total_tokens=256,
                max_running_requests=4, tp_size=size))
            logits = logits_of(runner, [prompt], steps=8)
            used = custom_all_reduce.lookup(get_tp_group())
            calls = dict(used.calls) if used is not None else {}
            results.put((rank, mode, calls, ropes.count(gemv_pairs.ROPE),
                         [t.float().cpu().numpy() for t in logits] if rank == 0 else None))
            del runner, used
        _leave_custom_ar()
    finally:
        gemv_pairs._launch = launch
        for name in CHAIN_MODES["base"]:
            os.environ.pop(name, None)
        destroy_tp_group()
