"""Helpers shared by the concrete backends: error wrapping, finish-reason normalization,
image encoding and chat-message shaping. No heavy imports here: ``import sgdsl.backends`` must
stay cheap."""
from __future__ import annotations

import base64
import json
from typing import Any, Iterable, Mapping

from .base import BackendError, Context, ImageData, Message


def backend_error(backend: str, cause: BaseException, status: int | None = None,
                  what: str = "request failed") -> BackendError:
    """A ``BackendError`` naming the backend and the HTTP status, chained to ``cause``.

    Callers ``raise backend_error(...) from cause`` so the client's own exception stays
    visible as ``__cause__``; ``.backend`` and ``.status`` are also set as attributes."""
    status = status if status is not None else _status_of(cause)
    detail = str(cause) or type(cause).__name__
    where = f"HTTP {status}: " if status is not None else ""
    err = BackendError(f"{backend} backend: {what}: {where}{detail}")
    err.backend = backend  # type: ignore[attr-defined]
    err.status = status  # type: ignore[attr-defined]
    err.__cause__ = cause
    return err


def _status_of(cause: BaseException) -> int | None:
    for attr in ("status_code", "status"):
        value = getattr(cause, attr, None)
        if isinstance(value, int):
            return value
    response = getattr(cause, "response", None)
    value = getattr(response, "status_code", None)
    return value if isinstance(value, int) else None


def finish_reason(kind: str | None, matched: Any = None, length: int | None = None) -> dict:
    """SGLang-shaped finish reason (``{"type": "stop"|"length"|"abort", ...}``), the one shape
    every backend puts in ``meta_info["finish_reason"]``."""
    if kind in ("length", "max_tokens", "model_length"):
        return {"type": "length", "length": length}
    if kind in ("abort", "cancelled"):
        return {"type": "abort", "message": str(matched or "aborted")}
    reason: dict[str, Any] = {"type": "stop"}
    if matched is not None:
        reason["matched"] = matched
    return reason


def data_url(image: ImageData) -> str:
    return f"data:{image.mime_type};base64,{base64.b64encode(image.data).decode('ascii')}"


def b64(image: ImageData) -> str:
    return base64.b64encode(image.data).decode("ascii")


def chat_messages(ctx: Context) -> list[Message]:
    """The messages to send for ``ctx``: its chat rendering, or (a program without roles) its
    text as one user message. Images attached only to the context go on the first user turn."""
    messages = list(ctx.messages)
    if not messages:
        if not ctx.text and not ctx.images:
            return []
        messages = [Message(role="user", content=ctx.text, images=tuple(ctx.images))]
        return messages
    attached = {id(img) for m in messages for img in m.images}
    loose = tuple(img for img in ctx.images if id(img) not in attached)
    if loose:
        i = next((k for k, m in enumerate(messages) if m.role == "user"), 0)
        m = messages[i]
        messages[i] = Message(role=m.role, content=m.content, images=loose + tuple(m.images))
    return messages


def merge_turns(messages: Iterable[Message]) -> list[Message]:
    """Merge consecutive messages of one role (chat APIs want alternating turns)."""
    merged: list[Message] = []
    for m in messages:
        if merged and merged[-1].role == m.role:
            last = merged[-1]
            merged[-1] = Message(role=m.role, content=last.content + m.content,
                                 images=last.images + m.images)
        else:
            merged.append(m)
    return merged


def choice_schema(choices: Iterable[str]) -> dict:
    """An object schema whose one field must be one of ``choices`` (APIs want object roots)."""
    return {"type": "object", "properties": {"choice": {"type": "string", "enum": list(choices)}},
            "required": ["choice"], "additionalProperties": False}


def parse_choice(text: str, choices: list[str], backend: str) -> int:
    """Index of the choice named by ``text`` (a JSON object from ``choice_schema`` or a dict)."""
    try:
        value = (json.loads(text) if isinstance(text, str) else text)["choice"]
        return choices.index(value)
    except (ValueError, KeyError, TypeError) as exc:
        raise backend_error(backend, exc, what=f"select answer {text!r} names none of {choices}")


def as_schema(value: Any) -> dict:
    """A JSON schema given as a string or a mapping, as a dict."""
    if isinstance(value, Mapping):
        return dict(value)
    return json.loads(value)


def wants_extensions(base_url: str | None, official_host: str) -> bool:
    """Whether to send non-standard sampling fields (top_k, min_p, min_tokens, ignore_eos...)
    in ``extra_body``: yes for self-hosted compatible servers (sgdsl, SGLang, vLLM), no for the
    vendor's own API, which rejects unknown fields."""
    return bool(base_url) and official_host not in str(base_url)


EXTENSION_FIELDS = {  # sgdsl.ir name -> extra_body name understood by sgdsl/SGLang servers
    "min_tokens": "min_tokens", "min_p": "min_p", "ignore_eos": "ignore_eos",
    "stop_token_ids": "stop_token_ids", "top_k": "top_k", "seed": "seed",
    "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty",
}


def split_extensions(params: Any, native: Iterable[str], backend: str,
                     extensions: bool) -> dict[str, Any]:
    """The fields of ``params`` set to non-default values that the vendor API lacks (not in
    ``native``): returned for ``extra_body`` when ``extensions``, else an UnsupportedError so
    that nothing is dropped silently."""
    from .base import UnsupportedError

    native = set(native)
    extra: dict[str, Any] = {}
    for name, body_name in EXTENSION_FIELDS.items():
        value = getattr(params, name)
        if name in native or value is None or value == params.DEFAULTS[name] or (
                name == "stop_token_ids" and not value):
            continue
        extra[body_name] = list(value) if isinstance(value, tuple) else value
    if extra and not extensions:
        raise UnsupportedError(
            f"{backend} API has no {', '.join(sorted(extra))}; pass extensions=True if the "
            "server accepts them (sgdsl, SGLang and vLLM servers do)")
    return extra
