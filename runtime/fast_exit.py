"""Ending a process that has shut down cleanly without the interpreter's teardown.

A scheduler rank or a server process holds a large heap (torch, the model, the tokenizer and
its vocabulary tables). Interpreter teardown spends seconds of one core collecting it
(``gc_collect_main`` under ``Py_FinalizeEx``: 4.7 s of a tiny engine's 5.7 s shutdown at load 7),
freeing memory the OS takes back at once anyway. Callers use this only once everything the
process owes others is done (sockets closed, children stopped, files written).
"""
from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn


def exit_without_teardown(code: int = 0) -> NoReturn:
    """Flush the log handlers and stdio (what atexit would still do for us), then exit."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
