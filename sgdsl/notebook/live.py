"""The live view: a state displayed once and refreshed in place while its program streams
(``IPython.display`` handles; no widgets needed)."""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from sgdsl.notebook.html import render_html

if TYPE_CHECKING:
    from sgdsl.interpreter.executor import StateExecutor

REFRESH_SECONDS = 0.1


def live_display(ex: "StateExecutor") -> Any:
    """Display the state and update it in place until the program finishes. Returns the
    display handle (None outside IPython)."""
    try:
        from IPython.display import HTML, display  # noqa: PLC0415
    except ImportError:
        return None
    handle = display(HTML(render_html(ex)), display_id=True)
    if handle is None:
        return None

    def refresh() -> None:
        seen = -1
        while True:
            version = ex.signal.version
            if version != seen:
                handle.update(HTML(render_html(ex)))
                seen = version
            if ex.finished:
                handle.update(HTML(render_html(ex)))
                return
            ex.signal.wait_for(lambda: ex.signal.version != version or ex.finished, REFRESH_SECONDS * 10)

    threading.Thread(target=refresh, name="sgdsl-display", daemon=True).start()
    return handle
