"""TP layout checks before any process starts: config fields, devices per node, rank placement."""
from __future__ import annotations

import pytest
import torch

from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.distributed import launch
from sgdsl.runtime.errors import InvalidRequestError, ModelLoadError


@pytest.mark.parametrize("kwargs,field,text", [
    (dict(tp_size=0), "tp_size", "must be >= 1"),
    (dict(tp_size=3, nnodes=2, dist_init_addr="h:1"), "tp_size", "multiple of nnodes=2"),
    (dict(tp_size=2, nnodes=2, node_rank=2, dist_init_addr="h:1"), "node_rank", r"\[0, 1\]"),
    (dict(tp_size=2, nnodes=2), "dist_init_addr", "required with nnodes > 1"),
    (dict(dist_init_addr="nohost"), "dist_init_addr", "HOST:PORT"),
])
def test_bad_layouts_name_the_field(kwargs, field, text):
    with pytest.raises(InvalidRequestError, match=text) as info:
        EngineConfig(**kwargs)
    assert info.value.field == field


def test_more_ranks_than_gpus_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ModelLoadError, match="tp_size=2 over nnodes=1 needs 2 GPUs on this "
                                             "node, found 1"):
        launch.check_devices(EngineConfig(tp_size=2, device="cuda"))
    launch.check_devices(EngineConfig(tp_size=4, nnodes=4, dist_init_addr="h:1", device="cuda"))
    launch.check_devices(EngineConfig(tp_size=2, device="cpu"))


def test_ranks_are_spread_over_nodes():
    cfg = EngineConfig(tp_size=4, nnodes=2, node_rank=1, dist_init_addr="10.0.0.1:29500")
    method = launch.init_method(cfg)
    assert method == "tcp://10.0.0.1:29500"
    specs = launch.node_ranks(cfg, method)
    assert [(s.rank, s.local_rank, s.size) for s in specs] == [(2, 0, 4), (3, 1, 4)]
    assert specs[1].device(cfg.replace(device="cuda")) == torch.device("cuda", 1)
    assert specs[1].device(cfg.replace(device="cpu")) == torch.device("cpu")
    assert launch.init_method(EngineConfig(tp_size=2)).startswith("tcp://127.0.0.1:")


def test_a_rank_hung_at_startup_is_named():
    """The startup barrier (scheduler/process.py) names the rank that never arrived."""
    import multiprocessing as mp
    import socket

    from .tp_worker import barrier_probe

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        method = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=barrier_probe, args=(r, 2, method, results), daemon=True)
             for r in range(2)]
    for p in procs:
        p.start()
    try:
        message = results.get(timeout=120)
    finally:
        for p in procs:
            p.join(20)
            if p.is_alive():
                p.kill()
    assert "Ranks 1 failed to pass monitoredBarrier" in message, message


def test_hang_monitor_blames_the_rank_furthest_behind(monkeypatch):
    from sgdsl.runtime.distributed import heartbeat

    now = [100.0]
    monkeypatch.setattr(heartbeat.time, "monotonic", lambda: now[0])
    counts = [5, 5, 5]
    mon = heartbeat.HangMonitor(counts, timeout_s=10)
    counts[0], counts[2] = 6, 6
    now[0] = 105.0
    assert mon.hung() is None  # rank 1 still for 5 s: not yet
    counts[0] = counts[2] = 7
    now[0] = 111.0
    assert mon.hung() == [1]
