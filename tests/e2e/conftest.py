"""End-to-end fixtures: ONE Engine with the embedded model per session (the suite-wide
``embedded_engine`` of tests/conftest.py), used in-process by ``Local`` and served over loopback
(uvicorn in a thread, same engine) to ``RuntimeEndpoint``, ``OpenAI`` and ``Anthropic`` (official
clients). One model load for the whole suite's default-engine tests."""
from __future__ import annotations

from typing import Any, Iterator

import pytest

from sgdsl.runtime.server.thread_server import ThreadServer

BACKENDS = ("local", "endpoint", "openai", "anthropic")


@pytest.fixture(scope="session")
def engine(embedded_engine: Any) -> Any:
    """The embedded SmolLM2-135M-Instruct: the suite's one default ``Engine()``
    (tests/conftest.py), shared with the runtime tests that need one, so the suite loads it
    once (a default engine's start is seconds of CPU on the 2-core CI box, with its compile
    workers)."""
    return embedded_engine


@pytest.fixture(scope="session")
def server_url(engine: Any) -> Iterator[str]:
    from sgdsl.runtime.server.app import create_app
    from sgdsl.runtime.server.args import ServerArgs

    server = ThreadServer(create_app(engine, ServerArgs()))
    yield server.start()
    server.stop()


@pytest.fixture(scope="session")
def model_name(engine: Any) -> str:
    info = engine.model_info
    return str(info.get("served_model_name") or info["model_path"])


@pytest.fixture(scope="session")
def backends(engine: Any, server_url: str, model_name: str) -> dict[str, Any]:
    """Each backend kind, built once (clients are cheap; the engine is shared)."""
    from sgdsl.backends import Anthropic, Local, OpenAI, RuntimeEndpoint

    return {"local": Local(engine=engine), "endpoint": RuntimeEndpoint(server_url),
            "openai": OpenAI(model_name, base_url=server_url + "/v1", api_key="unused"),
            "anthropic": Anthropic(model_name, base_url=server_url, api_key="unused")}


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, backends: dict[str, Any]) -> Any:
    return backends[request.param]


@pytest.fixture(params=("local", "endpoint"))
def runtime_backend(request: pytest.FixtureRequest, backends: dict[str, Any]) -> Any:
    """The backends with prompt logprobs and the runtime's own chat template."""
    return backends[request.param]
