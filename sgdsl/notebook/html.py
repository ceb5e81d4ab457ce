"""A ``StateView`` as HTML: one block per turn with its role, generated spans highlighted and
titled by variable, images inline, forks side by side, the error in place with its program
line, a summary line, and per call a collapsed details panel (``call_panel.py``).

Self-contained HTML with a scoped stylesheet and no scripts: notebooks do not run scripts of
untrusted outputs, and nbconvert's HTML shows the same thing."""
from __future__ import annotations

from base64 import b64encode
from html import escape
from typing import TYPE_CHECKING

from sgdsl.notebook.call_panel import render_call
from sgdsl.notebook.view_model import ErrorView, ForkView, Span, StateView, Summary, Turn

if TYPE_CHECKING:
    from sgdsl.interpreter.executor import StateExecutor

_CSS = """<style>
.sgdsl-state{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:13px;max-width:100%}
.sgdsl-turn{border-radius:6px;padding:6px 10px;margin:4px 0;white-space:pre-wrap;background:#fafafa}
.sgdsl-turn[data-role=system]{background:#f3f0ff}.sgdsl-turn[data-role=user]{background:#eef6ff}
.sgdsl-turn[data-role=assistant]{background:#f1fbf1}
.sgdsl-role{font-weight:bold;color:#555;white-space:normal}
.sgdsl-gen{background:#fff3b0;border-bottom:2px solid #e0b400;border-radius:3px}
.sgdsl-image{max-width:240px;max-height:240px;display:block;margin:4px 0}
.sgdsl-calls{white-space:normal;margin-top:4px;font-size:12px;color:#444}
.sgdsl-call summary{cursor:pointer}.sgdsl-facts th{text-align:left;padding-right:8px;font-weight:normal;color:#666}
.sgdsl-grammar pre{max-height:160px;overflow:auto;background:#f6f6f6;padding:4px;margin:2px 0}
.sgdsl-tokens{white-space:normal;line-height:1.9}
.sgdsl-token{border:1px solid #ddd;border-radius:3px;padding:0 2px;margin:0 1px;white-space:pre}
.sgdsl-forced{border:1px dashed #06c}
.sgdsl-forks{display:flex;gap:8px;align-items:flex-start}
.sgdsl-fork{flex:1;min-width:0;border-left:3px solid #ccc;padding-left:6px}
.sgdsl-fork-label,.sgdsl-summary,.sgdsl-running{color:#888;font-size:12px}
.sgdsl-error{background:#fdecea;color:#a00;border-radius:6px;padding:6px 10px;margin:4px 0;white-space:pre-wrap}
</style>"""


def render_html(ex: "StateExecutor") -> str:
    """The whole state as HTML (rebuilt from the state each call)."""
    from sgdsl.notebook.view_model import build  # noqa: PLC0415

    return f'{_CSS}<div class="sgdsl-state">{_state(build(ex))}</div>'


def _state(view: StateView) -> str:
    parts = [_fork(item) if isinstance(item, ForkView) else _turn(item) for item in view.items]
    if view.error is not None:
        parts.append(_error(view.error))
    elif view.running:
        parts.append('<div class="sgdsl-running">running…</div>')
    if view.summary is not None:
        parts.append(_summary(view.summary))
    return "".join(parts)


def _turn(turn: Turn) -> str:
    role = escape(turn.role) if turn.role else ""
    label = f'<div class="sgdsl-role">{role}</div>' if role else ""
    body = "".join(_span(s) for s in turn.spans)
    calls = turn.calls
    panel = (f'<div class="sgdsl-calls">{"".join(render_call(c) for c in calls)}</div>'
             if calls else "")
    return f'<div class="sgdsl-turn" data-role="{role}">{label}{body}{panel}</div>'


def _span(span: Span) -> str:
    if span.kind == "image":
        image = span.image
        data = b64encode(image.data).decode() if image is not None else ""
        mime = escape(image.mime_type) if image is not None else ""
        return f'<img class="sgdsl-image" alt="image" src="data:{mime};base64,{data}">'
    text = escape(span.text)
    if span.kind != "gen":
        return text
    name = escape(span.name or "")
    return f'<span class="sgdsl-gen" title="{name}" data-var="{name}">{text}</span>'


def _fork(fork: ForkView) -> str:
    columns = "".join(
        f'<div class="sgdsl-fork"><div class="sgdsl-fork-label">fork {i}</div>{_state(s)}</div>'
        for i, s in enumerate(fork.states))
    joined = (f'<div class="sgdsl-fork-label">joined ({escape(fork.join_mode)})</div>'
              if fork.join_mode else "")
    return f'<div class="sgdsl-forks">{columns}</div>{joined}'


def _error(error: ErrorView) -> str:
    where = f"\n{escape(error.where)}" if error.where else ""
    return f'<div class="sgdsl-error">{escape(error.message)}{where}</div>'


def _summary(s: Summary) -> str:
    parts = [f"{s.calls} call{'s' if s.calls != 1 else ''}",
             f"{s.prompt_tokens} prompt + {s.completion_tokens} completion tokens"]
    if s.cache_hit is not None:
        parts.append(f"cache hit {s.cache_hit:.0%}")
    if s.cost:
        parts.append(f"${s.cost:.6f}")
    parts.append("running" if s.elapsed_s is None else
                 (f"{s.elapsed_s * 1000:.0f} ms" if s.elapsed_s < 1 else f"{s.elapsed_s:.2f} s"))
    return f'<div class="sgdsl-summary">{" · ".join(parts)}</div>'
