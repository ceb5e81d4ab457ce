"""``sgdsl serve --dp-size N``: N replica servers behind the router on one port.

Each replica is a full ``sgdsl serve`` worker on a private loopback port (its own scheduler; a
TP group of ``--tp-size`` ranks on its own slice of the GPUs), and this process runs the router
in front of them. One code path serves both ``--dp-size`` and a standalone router over many
machines: the same policies, health checks, failover and metrics; a replica that crashes takes
only itself down. The price is one loopback HTTP hop per request, small next to a generation.
"""
from __future__ import annotations

import sys
from typing import Any, Sequence

import httpx

from ..router.cli import serve
from ..router.config import RouterConfig
from .replicas import gpu_slices, start_replicas, stop_replicas


def check(engine_config: Any, dp_size: int) -> str:
    """Why these options cannot run as replicas ("" if they can)."""
    if dp_size < 1:
        return f"dp_size: must be >= 1, got {dp_size}"
    if getattr(engine_config, "nnodes", 1) > 1 or getattr(engine_config, "dist_init_addr", None):
        # Every replica would meet at the same rendezvous; each picks a free port by itself.
        return ("dp_size: --dp-size does not take --nnodes > 1 or --dist-init-addr; run each "
                "multi-node replica with `sgdsl serve` and put `sgdsl router` in front")
    return ""


def serve_dp(argv: Sequence[str], engine_config: Any, server_args: Any, dp_size: int,
             policy: str) -> int:
    """Start ``dp_size`` replicas with the server command line ``argv``; route between them
    on ``server_args``' host and port until SIGINT/SIGTERM."""
    problem = check(engine_config, dp_size)
    if problem:
        print(f"sgdsl serve: error: {problem}", file=sys.stderr)
        return 2
    # pp: a replica's GPUs are those of all its pipeline stages
    gpus = gpu_slices(dp_size, getattr(engine_config, "world_size", 1), engine_config.device)
    replicas = start_replicas(dp_size, argv, gpus)
    try:
        config = RouterConfig(worker_urls=tuple(r.url for r in replicas), policy=policy,
                              host=server_args.host, port=server_args.port,
                              api_key=server_args.api_key,
                              max_body_bytes=server_args.max_body_bytes,
                              log_level=server_args.log_level)
        name = _model_name(replicas[0].url, server_args.api_key)
        tp = getattr(engine_config, "tp_size", 1)
        # NOTE: uvicorn re-raises SIGTERM once it has drained, so the replicas are stopped in
        # the app's shutdown hook; ``finally`` covers failures before the router runs.
        serve(config, lambda url: f"sgdsl server listening on {url} [dp_size={dp_size}, "
                                  f"tp_size={tp}, policy={policy}] (model: {name})",
              on_shutdown=lambda: stop_replicas(replicas, server_args.graceful_timeout_s))
    finally:
        stop_replicas(replicas, server_args.graceful_timeout_s)
    return 0


def _model_name(url: str, api_key: str | None) -> str:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    info = httpx.get(f"{url}/get_model_info", headers=headers, timeout=30).json()
    return info.get("served_model_name") or "default"
