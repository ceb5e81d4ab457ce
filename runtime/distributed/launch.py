"""Starting the worker processes of a tensor-parallel group: one per rank, each owning one
device, all joining one torch.distributed group at a TCP rendezvous.

Ranks are spread evenly over ``nnodes`` machines: node ``k`` runs ranks
``[k * per_node, (k + 1) * per_node)`` on its local devices 0..per_node-1. Rank 0 (node 0)
talks to the engine's main process; every other rank follows it (``scheduler/process.py``).
"""
from __future__ import annotations

import multiprocessing as mp
import socket
import time
from dataclasses import dataclass
from typing import Any

import torch

from ..config import EngineConfig
from ..errors import ModelLoadError


SPAWN = mp.get_context("spawn")


@dataclass(frozen=True)
class RankSpec:
    """One worker's place in the group and where the group meets."""

    rank: int
    size: int
    local_rank: int
    init_method: str  # tcp://HOST:PORT

    def device(self, config: EngineConfig) -> torch.device:
        kind = config.device
        if kind == "auto":
            kind = "cuda" if torch.cuda.is_available() else "cpu"
        return torch.device("cuda", self.local_rank) if kind == "cuda" else torch.device("cpu")


def init_method(config: EngineConfig) -> str:
    """``dist_init_addr``, else a free port on this machine (single node)."""
    if config.dist_init_addr:
        return f"tcp://{config.dist_init_addr}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def node_ranks(config: EngineConfig, method: str) -> list[RankSpec]:
    """The ranks this node (``config.node_rank``) runs."""
    world = config.world_size  # pp: every stage's TP group
    per_node = world // config.nnodes
    first = config.node_rank * per_node
    return [RankSpec(first + i, world, i, method) for i in range(per_node)]


def check_devices(config: EngineConfig) -> None:
    """A node needs one device per local rank; say so before starting anything."""
    per_node = config.world_size // config.nnodes  # pp: tp_size x pp_size ranks
    wants_cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    if wants_cuda and per_node > torch.cuda.device_count():
        pp = f" x pp_size={config.pp_size}" if config.pp_size > 1 else ""  # pp:
        raise ModelLoadError(f"tp_size={config.tp_size}{pp} over nnodes={config.nnodes} needs "
                             f"{per_node} GPUs on this node, found {torch.cuda.device_count()}")


def check_model(config: EngineConfig) -> None:
    """Refuse a head (or expert) split the layers cannot do before any rank starts; resolving the model
    here also converts or downloads it once, not once per rank."""
    from ..layers.linear import check_heads
    from ..layers.moe.layer import check_expert_split
    from ..model.loader import resolve_model_dir
    from ..model.model_config import ModelConfig
    from .pipeline import check_architecture, check_layers

    mc = ModelConfig.from_dir(resolve_model_dir(config))
    check_heads(mc.num_heads, mc.num_kv_heads, config.tp_size)
    check_expert_split(mc.num_experts, config.ep_size)
    check_layers(mc.num_layers, config.pp_size)  # pp:
    check_architecture(mc.architecture, config.pp_size)  # pp:


def start_ranks(config: EngineConfig, specs: list[RankSpec], paths: Any,
                parent_pid: int, start: Any, beats: Any = None) -> list[Any]:
    """One spawned worker per spec (``start(proc)`` starts it); on a failure to start one, the
    ones already started are stopped. ``beats``: ``heartbeat.Heartbeats`` counters (indexed by
    local rank), or None."""
    from ..scheduler.process import run_scheduler_process

    ctx = SPAWN
    procs: list[Any] = []
    try:
        for spec in specs:
            name = "sgdsl-scheduler" if spec.rank == 0 else f"sgdsl-tp{spec.rank}"
            proc = ctx.Process(target=run_scheduler_process, name=name, daemon=True,
                               args=(config, paths, parent_pid, spec, beats))
            start(proc)
            procs.append(proc)
    except BaseException:
        stop_processes(procs, 0.0)
        raise
    return procs


def stop_processes(procs: list[Any], grace_s: float) -> None:
    """Wait up to ``grace_s`` for the workers to exit, then kill the rest and reap them all."""
    deadline = time.monotonic() + grace_s
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        time.sleep(0.02)
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(5)
