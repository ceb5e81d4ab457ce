"""Typed errors of the runtime. Every boundary raises one of these; the server maps them to
each protocol's error shape (status code from ``status``)."""
from __future__ import annotations


class RuntimeErrorBase(Exception):
    """Base of all runtime errors. ``status`` is the HTTP status a server answers with."""

    status: int = 500
    kind: str = "internal_error"


class InvalidRequestError(RuntimeErrorBase, ValueError):
    """Bad input: names the offending ``field`` and the limit it broke."""

    status = 400
    kind = "invalid_request_error"

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class ContextLengthError(InvalidRequestError):
    """Prompt plus requested tokens do not fit the model's context window."""


class RequestTooLargeError(InvalidRequestError):
    """The request exceeds a size limit (e.g. KV capacity); answered with 413."""

    status = 413


class ConstraintViolationError(RuntimeErrorBase):
    """A constrained generation finished with an output its constraint rejects (the runtime's
    check of every finished json_schema output): reported instead of a silent success."""

    status = 500
    kind = "constraint_violation"


class OverloadedError(RuntimeErrorBase):
    """The engine is too busy to take this request now; nothing is wrong with the request.
    Retryable: ``retry_after`` is the seconds to wait before trying again (the server answers
    503 with a ``Retry-After`` header)."""

    status = 503
    kind = "overloaded"

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = max(1.0, float(retry_after))


class GrammarQueueFullError(OverloadedError):
    """A constrained request would wait too long for a grammar compile worker (the compile
    queue's expected wait is past ``grammar_compile_max_wait_s``, or the queue is full)."""

    kind = "grammar_queue_full"


class KVTransferError(OverloadedError):
    """pd: a disaggregated request's KV did not arrive (the other server died, timed out or
    refused it); nothing is wrong with the request, so it is retryable (503)."""

    kind = "kv_transfer_failed"


class ModelLoadError(RuntimeErrorBase):
    """Unknown architecture, missing files, bad config: raised at engine start."""

    kind = "model_load_error"


class EngineDeadError(RuntimeErrorBase):
    """The scheduler process died; carries its real traceback text."""

    status = 503
    kind = "engine_dead"


class AbortedError(RuntimeErrorBase):
    """The request was aborted (by the caller, a disconnect or shutdown)."""

    status = 499
    kind = "aborted"


def error_of(reason: dict | None) -> RuntimeErrorBase | None:
    """The typed error a list-returning ``generate`` reported in one request's finish_reason
    (``{"type": "abort", "message", "status_code", "err_type"}``, docs/engine_api.md), or None
    for any other finish (an abort by request included), e.g. for a caller that batched single
    requests and must raise each one's own error."""
    if not isinstance(reason, dict) or reason.get("type") != "abort" or "err_type" not in reason:
        return None
    key = (reason.get("err_type"), reason.get("status_code"))
    cls = next((c for c in _TYPED if (c.kind, c.status) == key), RuntimeErrorBase)
    message = str(reason.get("message") or "request failed")
    err = (cls(message, reason.get("retry_after", 1.0)) if issubclass(cls, OverloadedError)
           else cls(message))
    if cls is RuntimeErrorBase:  # an error type this module does not name: keep its facts
        err.kind, err.status = str(key[0]), key[1] if isinstance(key[1], int) else 500
    return err


_TYPED = (InvalidRequestError, RequestTooLargeError, ConstraintViolationError, EngineDeadError,
          AbortedError, ModelLoadError, GrammarQueueFullError, KVTransferError, OverloadedError)
