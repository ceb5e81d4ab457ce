"""The stream interpreter: executes IR nodes per program state, in order, against a Backend.

The core is asyncio (``StateExecutor`` runs on an event loop); program bodies are ordinary
synchronous Python run in threads, so ``s["x"]`` can block until ``x`` is generated while
other states keep running. The sync API drives a shared background loop (``loop.py``).
"""
from sgdsl.interpreter.executor import StateExecutor
from sgdsl.interpreter.program_run import ProgramRun

__all__ = ["ProgramRun", "StateExecutor"]
