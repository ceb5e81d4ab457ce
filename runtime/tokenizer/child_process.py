"""Starting and reaping the engine's child processes from the main process (TokenizerManager,
and a multi-node follower's ranks)."""
from __future__ import annotations

import asyncio
import time
from typing import Any


def start_without_main(proc: Any) -> None:
    """Start a spawn child without re-running the parent's ``__main__`` in it.

    NOTE: spawn normally re-imports the main script in the child, which makes every script that
    creates an Engine at top level (no ``if __name__ == "__main__"`` guard) start itself again.
    The child only needs ``run_scheduler_process`` (an importable module), so the main module's
    path is hidden while the child's preparation data is taken."""
    import sys

    main = sys.modules.get("__main__")
    saved = {k: getattr(main, k) for k in ("__file__", "__spec__") if hasattr(main, k)}
    try:
        if "__file__" in saved:
            delattr(main, "__file__")
        if "__spec__" in saved:
            main.__spec__ = None
        proc.start()
    finally:
        for key, value in saved.items():
            setattr(main, key, value)


def pid() -> int:
    import os

    return os.getpid()


async def wait_exit(proc, timeout: float) -> None:
    """Wait for a child process without a worker thread.

    NOTE: shutdown also runs from atexit, after the interpreter has closed the default thread
    pool, so ``asyncio.to_thread`` would raise there; polling keeps the loop free instead.
    """
    deadline = time.monotonic() + timeout
    while proc.is_alive() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    proc.join(0)
