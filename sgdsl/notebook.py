"""Jupyter rendering of a ProgramState: a chat-like view (one block per turn, role label,
generated spans highlighted), refreshed in place while a streaming program runs.

Plain HTML and ``IPython.display`` handles only (no ipywidgets)."""
from __future__ import annotations

import html
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sgdsl.interpreter.executor import StateExecutor

_COLORS = {"system": "#f3f0ff", "user": "#eef6ff", "assistant": "#f1fbf1", None: "#fafafa"}
_STYLE = ("font-family:ui-monospace,monospace;font-size:13px;border-radius:6px;"
          "padding:6px 10px;margin:4px 0;white-space:pre-wrap;")
_GEN = "background:#fff3b0;border-bottom:2px solid #e0b400;border-radius:3px;"
REFRESH_SECONDS = 0.1


def render_html(ex: "StateExecutor") -> str:
    """The state as HTML: consecutive segments of one turn share a block; role markup from
    the chat template is left out; generated text is highlighted (titled with its variable)."""
    blocks: list[tuple[str | None, list[str]]] = []
    for seg in list(ex.segments):
        if seg.kind == "template":
            if seg.role is not None and (not blocks or blocks[-1][0] != seg.role or _closed(blocks)):
                blocks.append((seg.role, []))
            continue
        if not blocks or blocks[-1][0] != seg.role:
            blocks.append((seg.role, []))
        text = html.escape(seg.text)
        if seg.kind == "gen":
            title = f' title="{html.escape(seg.name)}"' if seg.name else ""
            text = f'<span style="{_GEN}"{title}>{text}</span>'
        blocks[-1][1].append(text)
    body = "".join(_block(role, parts) for role, parts in blocks if parts or role)
    status = _status(ex)
    return f'<div class="sgdsl-state">{body}{status}</div>'


def _closed(blocks: list[tuple[str | None, list[str]]]) -> bool:
    return bool(blocks[-1][1])


def _block(role: str | None, parts: list[str]) -> str:
    label = f'<div style="font-weight:bold;color:#555">{html.escape(role)}</div>' if role else ""
    return f'<div style="{_STYLE}background:{_COLORS.get(role, "#fafafa")}">{label}{"".join(parts)}</div>'


def _status(ex: "StateExecutor") -> str:
    if ex.error_ is not None:
        err = html.escape(f"{type(ex.error_).__name__}: {ex.error_}")
        return f'<div style="{_STYLE}background:#fdecea;color:#a00">{err}</div>'
    if not ex.finished:
        return '<div style="color:#888;font-size:12px">running…</div>'
    return ""


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
