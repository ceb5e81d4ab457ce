"""Progress bars for ``run_batch(progress_bar=True)``: a widget in a notebook with ipywidgets, a
clean single line updated in place in a notebook without it (tqdm's fallback there prints a
warning and stderr lines), and tqdm's text bar in a terminal."""
from __future__ import annotations

import sys
import time
from typing import Any

_MIN_INTERVAL_S = 0.1


def progress_bar(total: int, desc: str = "run_batch") -> Any:
    """An object with ``update(n=1)`` and ``close()``."""
    if not _in_notebook():
        from tqdm.std import tqdm  # noqa: PLC0415

        return tqdm(total=total, desc=desc)
    try:
        import ipywidgets  # noqa: F401, PLC0415
        from tqdm.notebook import tqdm as notebook_tqdm  # noqa: PLC0415

        return notebook_tqdm(total=total, desc=desc)
    except Exception:  # no ipywidgets, or a version tqdm cannot drive: one clean text line
        return LineProgress(total, desc)


def _in_notebook() -> bool:
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    shell = ipython.get_ipython()
    return shell is not None and hasattr(shell, "kernel")


class LineProgress:
    """``desc: done/total [elapsed]`` as one text/plain output refreshed in place."""

    def __init__(self, total: int, desc: str) -> None:
        from IPython.display import display  # noqa: PLC0415

        self.total, self.desc, self.n = total, desc, 0
        self._start = self._shown = time.monotonic()
        self._handle = display(_Text(self._line()), display_id=True)

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self._shown >= _MIN_INTERVAL_S or self.n >= self.total:
            self._shown = now
            self._refresh()

    def close(self) -> None:
        self._refresh()

    def _refresh(self) -> None:
        if self._handle is not None:
            self._handle.update(_Text(self._line()))

    def _line(self) -> str:
        pct = f"{100 * self.n / self.total:3.0f}%" if self.total else "100%"
        return f"{self.desc}: {pct} {self.n}/{self.total} [{time.monotonic() - self._start:.1f} s]"


class _Text:
    """A display object with only a text/plain form."""

    def __init__(self, text: str) -> None:
        self.text = text

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.text)

    def __repr__(self) -> str:
        return self.text
