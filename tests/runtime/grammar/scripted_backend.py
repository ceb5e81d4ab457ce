"""A grammar backend whose compile does what the key's text says, for the compiler's tests.
It runs in the compile worker processes (the parent's sys.path goes with them), so every
behaviour is driven by the text, not by objects shared with the test."""
from __future__ import annotations

import ctypes
import os
import time

from sgdsl.runtime.errors import InvalidRequestError
from sgdsl.runtime.grammar import GrammarBackend, GrammarKey


class ScriptedBackend(GrammarBackend):
    """``sleep:S`` sleeps S s; ``spin:S`` computes for S s of CPU time; ``bad`` is a compile error; ``boom`` a bug; ``hog`` allocates
    until memory runs out; ``abort``/``segv`` kill the worker; ``lambda`` cannot be pickled;
    ``pid`` returns the worker's pid; anything else compiles to ``"compiled:<text>"``."""

    name = "scripted"

    def __init__(self) -> None:
        super().__init__(64, [0])
        self.spec = ScriptedBackend

    def compile(self, key: GrammarKey):
        text = key.text
        if text.startswith("sleep:"):
            time.sleep(float(text.split(":")[1]))
        elif text.startswith("spin:"):  # CPU work, what a compile's deadline counts
            end = time.process_time() + float(text.split(":")[1])
            while time.process_time() < end:
                pass
        elif text == "bad":
            raise InvalidRequestError("bad grammar", field=key.field)
        elif text == "boom":
            raise KeyError("internal")
        elif text == "hog":
            hoard = []
            while True:
                hoard.append(bytearray(64 << 20))
        elif text == "abort":
            os.abort()
        elif text == "segv":
            ctypes.string_at(0)
        elif text == "lambda":
            return lambda: None
        elif text == "pid":
            return os.getpid()
        return f"compiled:{text}"

    def new_grammar(self, compiled):
        return compiled


class ScriptedAgainBackend(ScriptedBackend):
    """Also ships a second payload (``ship_again``) as ``again:<what>`` keys say: ``ok`` (the
    compiled text + ``+again``), ``spin:S`` (S s of CPU first), ``hog`` (out of memory)."""

    ships_again = True

    def __init__(self) -> None:
        super().__init__()
        self.spec = ScriptedAgainBackend

    def may_ship_again(self, compiled):
        return "again:" in compiled

    def ship_again(self, compiled):
        what = compiled.split("again:", 1)[1] if "again:" in compiled else ""
        if what.startswith("spin:"):
            self.compile(GrammarKey("regex", what))
        elif what == "hog":
            self.compile(GrammarKey("regex", "hog"))
        return self.serialize(compiled + "+again") if what else None
