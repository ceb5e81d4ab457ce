"""What one expert-parallel MoE layer call costs in launches and collectives, per dispatch path:
two gloo ranks (EP=2, 128 experts top-8 as Qwen3-30B-A3B, tiny hidden), the layer called as a
decode CUDA graph runs it (``padded_layout``), every torch op counted (on the GPU each non-view
op is a kernel launch) and every collective. The expert product itself is stubbed (one op), so
the counts are what the path adds around it. CPU only; no timing. NOTE: on the CPU the routing
(softmax, topk, renormalize, and for the all-reduce path the local ids and the weight masking)
is ~15 torch ops; on the GPU it is one kernel (``kernels/moe_routing.py``) in both paths.

  python benchmarks/ep_layer_ops.py
"""
from __future__ import annotations

import collections
import socket

import torch
import torch.multiprocessing as mp
from torch.utils._python_dispatch import TorchDispatchMode

COLLECTIVES = ("alltoall", "_allgather", "allreduce", "allgather")
VIEWS = {"slice", "view", "unsqueeze", "permute", "select", "expand", "reshape", "_unsafe_view"}


class OpCount(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def rank(r: int, port: int, out) -> None:
    from sgdsl.runtime.distributed.state import destroy_tp_group, init_tp_group
    from sgdsl.runtime.layers.moe import dispatch
    from sgdsl.runtime.layers.moe.layer import FusedMoE

    init_tp_group(r, 2, torch.device("cpu"), f"tcp://127.0.0.1:{port}", timeout_s=60, ep_size=2)
    for mode in ("all_to_all", "auto"):
        dispatch.set_ep_dispatch(mode)
        layer = FusedMoE(128, 8, 64, 32, renormalize=True, dtype=torch.float32, device="cpu")
        layer.quant_method.apply = lambda _l, x, *_a, **_k: torch.zeros_like(x)  # the product
        for tokens in (1, 64):
            x, logits = torch.randn(tokens, 64), torch.randn(tokens, 128)
            with dispatch.padded_layout(), OpCount() as c:
                layer(x, logits)
            if r == 0:
                out.put((mode, tokens, c.ops))
    destroy_tp_group()


def main() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=rank, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    for _ in range(4):
        mode, tokens, ops = out.get()
        comm = {op: n for op, n in ops.items() if op.startswith(COLLECTIVES)}
        launches = sum(n for op, n in ops.items() if op not in VIEWS and op not in comm)
        print(f"ep_dispatch={mode:10s} T={tokens:3d}: {launches:3d} non-view torch ops, "
              f"collectives {comm}")
        print("   ", dict(ops))
    for p in procs:
        p.join()


if __name__ == "__main__":
    main()
