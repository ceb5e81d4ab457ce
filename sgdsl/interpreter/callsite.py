"""Where in the user's program a node was appended, so errors can name the program's line."""
from __future__ import annotations

import linecache
import os
import sys
from typing import NamedTuple

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class CallSite(NamedTuple):
    """A program line. A named tuple, not a frozen dataclass: one is built per ``s += ...``,
    and a tuple builds in a fraction of the time."""

    filename: str
    lineno: int
    function: str

    def describe(self) -> str:
        line = linecache.getline(self.filename, self.lineno).strip()
        where = f'File "{self.filename}", line {self.lineno}, in {self.function}'
        return f"{where}\n    {line}" if line else where


def capture() -> CallSite | None:
    """The innermost frame outside the sgdsl package (the program's line)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
    if frame is None:
        return None
    return CallSite(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)


def annotate(exc: BaseException, site: CallSite | None, what: str) -> None:
    """Attach the program line to ``exc`` (once) as an exception note."""
    if site is None or getattr(exc, "_sgdsl_annotated", False):
        return
    exc._sgdsl_annotated = True  # type: ignore[attr-defined]
    note = f"sgdsl: raised while executing {what} appended at\n  {site.describe()}"
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    exc.sgdsl_callsite = site  # type: ignore[attr-defined]
