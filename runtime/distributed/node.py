"""A node other than node 0 of a multi-node tensor-parallel group (``sgdsl serve --nnodes N
--node-rank K``, K > 0): it runs this node's ranks and nothing else (node 0 serves HTTP and
its rank 0 leads). It returns when its ranks exit: after node 0 shuts the group down, or when
one fails (then the others are stopped too, so nothing is left behind)."""
from __future__ import annotations

import logging
import os
import signal
import time
from typing import Any

from ..config import EngineConfig
from . import launch

logger = logging.getLogger(__name__)
POLL_S = 0.2


def run_node(config: EngineConfig) -> int:
    """Exit status: 0 when every rank exited cleanly."""
    launch.check_devices(config)
    specs = launch.node_ranks(config, launch.init_method(config))
    from ..tokenizer.child_process import start_without_main

    procs = launch.start_ranks(config, specs, None, os.getpid(), start_without_main)
    stop = _on_signals()
    try:
        while not stop and all(p.is_alive() for p in procs):
            time.sleep(POLL_S)
    finally:
        failed = [(s.rank, p.exitcode) for s, p in zip(specs, procs)
                  if not p.is_alive() and p.exitcode != 0]
        for rank, code in failed:
            logger.error("tensor-parallel rank %d exited with code %s", rank, code)
        launch.stop_processes(procs, 0.0 if (stop or failed) else 10.0)
    return 1 if failed else 0


def _on_signals() -> list[Any]:
    """SIGTERM / SIGINT stop the node's ranks (a non-empty list means: stop)."""
    stop: list[Any] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda num, frame: stop.append(num))
    return stop
