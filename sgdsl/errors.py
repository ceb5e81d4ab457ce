"""Typed exceptions at sgdsl's API boundary.

Errors raised while a program runs surface as the *real* exception (a backend's own error, a
``ConstraintViolationError``...) with a note naming the program line that issued the failing
node; these classes are the sgdsl-specific ones.
"""
from __future__ import annotations

from typing import Any


class SgdslError(Exception):
    """Base of all sgdsl errors."""


class BackendError(SgdslError):
    """A backend call failed; ``__cause__`` holds the client's own exception."""


class UnsupportedError(BackendError):
    """The backend cannot honour a request (a constraint, images, logprobs...). Raised before
    any token is generated, with a message saying what and why."""


class ConstraintViolationError(SgdslError):
    """Validate-and-retry gave up: no attempt satisfied the constraint."""

    def __init__(self, message: str, *, kind: str, attempts: int, last_output: Any) -> None:
        super().__init__(message)
        self.kind = kind
        self.attempts = attempts
        self.last_output = last_output


class BackendConfigError(SgdslError):
    """No backend could be built from an argument, ``SGDSL_BACKEND`` or a config file."""


class ProgramCancelledError(SgdslError):
    """The program was cancelled; raised in its body at the next ``s += ...`` or ``s[...]``."""


class TemplateNotFoundError(SgdslError, KeyError):
    """An unknown chat template name."""


class TracingError(SgdslError):
    """A program could not be traced (e.g. it used an argument's value as a Python value)."""
