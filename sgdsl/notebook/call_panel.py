"""The on-demand details of one ``gen``/``select``: a collapsed ``<details>`` line (variable,
tokens, latency, finish reason) that opens onto the tokens with their probabilities (when the
backend returned logprobs), tokens forced by the grammar (jump-forward), the constraint, cached
prompt tokens, validate-and-retry attempts, usage and cost. What a backend does not report is
simply absent. Plain HTML: the toggle needs no JavaScript, so it works in every notebook."""
from __future__ import annotations

import math
from html import escape
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sgdsl.interpreter.records import CallRecord

_MAX_TOKENS_SHOWN = 2000


def render_call(call: "CallRecord") -> str:
    meta = call.meta
    title = escape(call.name) if call.name else "(unnamed)"
    line = [f'<b>{title}</b>', call.kind]
    if meta.get("completion_tokens") is not None:
        line.append(f'{meta["completion_tokens"]} tok')
    if call.latency_s is not None:
        line.append(_seconds(call.latency_s))
    finish = _finish(meta.get("finish_reason"))
    if finish:
        line.append(escape(finish))
    if call.latency_s is None:
        line.append("running…")
    body = _facts(call) + _constraint(call) + _tokens(meta)
    return (f'<details class="sgdsl-call" data-var="{escape(call.name or "")}">'
            f'<summary>{" · ".join(line)}</summary>{body}</details>')


def _facts(call: "CallRecord") -> str:
    meta = call.meta
    rows: list[tuple[str, Any]] = [
        ("finish reason", _finish(meta.get("finish_reason"))),
        ("latency", _seconds(call.latency_s) if call.latency_s is not None else None),
        ("prompt tokens", meta.get("prompt_tokens")),
        ("cached prompt tokens", meta.get("cached_tokens")),
        ("completion tokens", meta.get("completion_tokens")),
        ("forced tokens (jump-forward)", _forced_count(meta)),
        ("attempts (validate-and-retry)", meta.get("attempts") if (meta.get("attempts") or 1) > 1 else None),
        ("last parse error", meta.get("parse_error")),
        ("cost", f'${meta["cost"]:.6f}' if meta.get("cost") else None),
        ("error", call.error),
    ]
    cells = "".join(f"<tr><th>{k}</th><td>{escape(str(v))}</td></tr>" for k, v in rows
                    if v not in (None, ""))
    return f'<table class="sgdsl-facts">{cells}</table>' if cells else ""


def _constraint(call: "CallRecord") -> str:
    if call.constraint is None:
        return ""
    kind, text = call.constraint
    return (f'<div class="sgdsl-grammar"><b>{escape(kind)}</b>'
            f'<pre>{escape(text)}</pre></div>')


def _tokens(meta: dict) -> str:
    entries = meta.get("output_token_logprobs")
    if not entries:
        return ""
    forced = set(meta.get("forced_token_positions") or ())
    spans = []
    for i, entry in enumerate(entries[:_MAX_TOKENS_SHOWN]):
        logprob, token_id, text = (list(entry) + [None, None, None])[:3]
        spans.append(_token(i, logprob, token_id, text, i in forced))
    more = len(entries) - _MAX_TOKENS_SHOWN
    tail = f'<span class="sgdsl-more">… {more} more</span>' if more > 0 else ""
    return f'<div class="sgdsl-tokens">{"".join(spans)}{tail}</div>'


def _token(i: int, logprob: Any, token_id: Any, text: Any, forced: bool) -> str:
    shown = text if isinstance(text, str) else (f"#{token_id}" if token_id is not None else "?")
    if logprob is None:
        prob, label = None, "forced by the grammar" if forced else "no logprob"
    else:
        prob = math.exp(float(logprob))
        label = f"p={prob:.3f} (logprob {float(logprob):.3f})"
        label += ", forced by the grammar" if forced else ""
    if token_id is not None:
        label = f"token {token_id}: {label}"
    style = "" if prob is None else f' style="background:rgba(255,170,0,{0.15 + 0.85 * (1 - prob):.2f})"'
    cls = "sgdsl-token sgdsl-forced" if forced else "sgdsl-token"
    return (f'<span class="{cls}"{style} title="{escape(label)}" data-i="{i}">'
            f'{escape(shown).replace(" ", "&middot;")}</span>')


def _forced_count(meta: dict) -> int | None:
    positions = meta.get("forced_token_positions")
    return len(positions) if positions else None


def _finish(reason: Any) -> str:
    if isinstance(reason, dict):
        kind = reason.get("type") or ""
        matched = reason.get("matched")
        return f"{kind} ({matched!r})" if matched not in (None, "") and kind == "stop" else kind
    if isinstance(reason, list):
        return ", ".join(_finish(r) for r in reason)
    return "" if reason is None else str(reason)


def _seconds(s: float) -> str:
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s"
