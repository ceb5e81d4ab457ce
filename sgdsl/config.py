"""Which backend a program runs on.

Precedence: the ``backend=`` argument > ``set_default_backend(...)`` > the ``SGDSL_BACKEND``
environment variable > ``backend = "..."`` in ``sgdsl.toml`` or ``[tool.sgdsl]`` of
``pyproject.toml`` (in the working directory or a parent) > ``Local()`` (the embedded model).

A spec string is one of ``local``, ``local:/path/to/model``, ``openai:MODEL``,
``anthropic:MODEL``, ``http(s)://host:port`` (a RuntimeEndpoint) or ``scripted`` (the test
backend). Constructors are imported from ``sgdsl.backends`` by name, only when needed.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from sgdsl.errors import BackendConfigError

ENV_VAR = "SGDSL_BACKEND"
_lock = threading.Lock()
_default: Any = None
_auto: dict[str, Any] = {}  # spec -> backend built from env/config, built once per process


def set_default_backend(backend: Any) -> None:
    global _default
    _default = backend_from_spec(backend) if isinstance(backend, str) else backend


def get_default_backend() -> Any:
    return _default


def resolve_backend(backend: Any = None) -> Any:
    """The backend to use, following the precedence above."""
    if isinstance(backend, str):
        return _cached(backend)
    chosen = backend if backend is not None else _default
    if chosen is None:
        chosen = _cached(configured_spec() or "local")
    # NOTE: SGLang's Runtime wraps an endpoint; accept either.
    return getattr(chosen, "endpoint", None) or chosen


def configured_spec(cwd: Path | None = None) -> str | None:
    """The spec from ``SGDSL_BACKEND`` or a config file, if any."""
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        return env
    for folder in [(cwd or Path.cwd()).resolve(), *(cwd or Path.cwd()).resolve().parents]:
        spec = _spec_in(folder / "sgdsl.toml", ()) or _spec_in(folder / "pyproject.toml", ("tool", "sgdsl"))
        if spec:
            return spec
    return None


def _spec_in(path: Path, section: tuple[str, ...]) -> str | None:
    if not path.is_file():
        return None
    try:
        import tomllib  # noqa: PLC0415
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib  # noqa: PLC0415
        except ImportError:
            return None
    table: Any = tomllib.loads(path.read_text())
    for key in section:
        table = table.get(key, {})
    value = table.get("backend")
    return str(value) if value else None


def _cached(spec: str) -> Any:
    with _lock:
        if spec not in _auto:
            _auto[spec] = backend_from_spec(spec)
        return _auto[spec]


def backend_from_spec(spec: str) -> Any:
    """Build a backend from a spec string (see the module docstring)."""
    kind, _, arg = spec.strip().partition(":")
    kind = kind.lower()
    if kind in ("http", "https"):
        return _make("RuntimeEndpoint", spec.strip())
    if kind == "local":
        return _make("Local", arg or None)
    if kind in ("openai", "anthropic"):
        if not arg:
            raise BackendConfigError(f"backend spec {spec!r} needs a model: {kind}:MODEL_NAME")
        return _make("OpenAI" if kind == "openai" else "Anthropic", arg)
    if kind == "scripted":
        from sgdsl.testing import ScriptedBackend  # noqa: PLC0415

        return ScriptedBackend()
    raise BackendConfigError(
        f"unknown backend spec {spec!r}; expected local, local:PATH, openai:MODEL, "
        "anthropic:MODEL or http://HOST:PORT")


def _make(name: str, arg: Any) -> Any:
    import sgdsl.backends as backends  # noqa: PLC0415

    try:
        cls = getattr(backends, name)
    except (ImportError, AttributeError) as exc:
        raise BackendConfigError(f"backend {name} is not available: {exc}") from exc
    return cls(arg) if arg is not None else cls()
