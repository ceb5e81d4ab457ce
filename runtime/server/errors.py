"""HTTP errors of the server, rendered in each protocol's own shape.

Every failure that reaches a client goes through ``error_response``: the route's protocol
(Anthropic for ``/v1/messages``, OpenAI for other ``/v1/`` routes, SGLang-native otherwise)
picks the body shape, and the status comes from the error itself. Bad input is always 4xx;
only a bug in the server answers 500. An overloaded engine (``OverloadedError``, e.g. the
grammar compile queue) answers 503 with a ``Retry-After`` header: retryable, never blamed on
the request.
"""
from __future__ import annotations

import json
import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import InvalidRequestError, OverloadedError, RuntimeErrorBase

logger = logging.getLogger(__name__)

# OpenAI error "type" per status; Anthropic has its own names.
_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                 404: "not_found_error", 405: "invalid_request_error",
                 413: "invalid_request_error", 499: "aborted", 503: "service_unavailable"}
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                    403: "permission_error", 404: "not_found_error", 405: "invalid_request_error",
                    413: "request_too_large", 499: "api_error", 503: "overloaded_error"}


class APIError(Exception):
    """An error with an HTTP status, raised by route handlers (unknown model, bad auth...)."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after  # seconds: the Retry-After header (503s)

    def headers(self) -> dict[str, str] | None:
        if self.retry_after is None:
            return None
        return {"Retry-After": str(max(1, math.ceil(self.retry_after)))}


class ClientDisconnected(Exception):
    """The client went away before its answer was ready; its requests were aborted."""


def protocol_of(path: str) -> str:
    """Which protocol's error shape a route answers with."""
    if path.startswith("/v1/messages"):
        return "anthropic"
    if path.startswith("/v1/"):
        return "openai"
    return "native"


def error_body(protocol: str, status: int, message: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """The JSON body of an error in ``protocol``'s shape."""
    if protocol == "anthropic":
        kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": message}}
    kind = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param,
                      "code": code if code is not None else status}}


def as_api_error(exc: BaseException) -> APIError:
    """Map any exception to an APIError (status, message, offending field)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, RuntimeErrorBase):
        field = exc.field if isinstance(exc, InvalidRequestError) else None
        retry = exc.retry_after if isinstance(exc, OverloadedError) else None
        return APIError(exc.status, str(exc), param=field, code=exc.kind, retry_after=retry)
    if isinstance(exc, RequestValidationError):
        return _from_validation(exc)
    if isinstance(exc, StarletteHTTPException):
        return APIError(exc.status_code, str(exc.detail))
    logger.exception("internal server error", exc_info=exc)
    return APIError(500, f"internal server error: {type(exc).__name__}: {exc}")


def error_response(path: str, exc: BaseException) -> JSONResponse:
    """The full JSON error response for a failure on route ``path``."""
    err = as_api_error(exc)
    body = error_body(protocol_of(path), err.status, err.message, err.param, err.code)
    return JSONResponse(body, status_code=err.status, headers=err.headers())


def sse_error_event(protocol: str, exc: BaseException) -> bytes:
    """An in-stream error event, for failures after the first token was sent."""
    err = as_api_error(exc)
    body = error_body(protocol, err.status, err.message, err.param, err.code)
    if protocol == "anthropic":
        return f"event: error\ndata: {json.dumps(body)}\n\n".encode()
    return f"data: {json.dumps(body)}\n\n".encode()


def _from_validation(exc: RequestValidationError) -> APIError:
    errors = exc.errors()
    if not errors:
        return APIError(400, "invalid request body")
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    if first.get("type") == "json_invalid":
        return APIError(400, f"malformed JSON body: {first.get('msg')}")
    msg = first.get("msg", "invalid value")
    if first.get("type") == "extra_forbidden":
        msg = "unknown parameter"
    return APIError(400, f"{param}: {msg}" if param else msg, param=param)


def install_error_handlers(app: FastAPI) -> None:
    """Route every failure through ``error_response``."""

    async def handle(request: Request, exc: Exception) -> JSONResponse:
        return error_response(request.url.path, exc)

    for kind in (APIError, RuntimeErrorBase, RequestValidationError, StarletteHTTPException,
                 Exception):
        app.add_exception_handler(kind, handle)
