"""The data-parallel router: one HTTP endpoint in front of any number of sgdsl (or SGLang)
servers, as SGLang's Model Gateway is.

- ``config.py``    RouterConfig (every option, validated once)
- ``breaker.py``   a circuit breaker per worker
- ``worker.py``    one upstream server: URL, load, health, breaker
- ``ledger.py``    the work a worker has left: its ``GET /load`` report + the router's bookings
- ``poller.py``    polls the workers' ``GET /load`` (for ``cost_aware``)
- ``registry.py``  the set of workers (added/removed at run time) and their health checks
- ``policies/``    how a worker is chosen (``base.py`` + one file per policy)
- ``proxy.py``     forwarding with retries before the first byte, SSE passthrough
- ``app.py``       the FastAPI app (protocol routes, admin routes, /metrics, /health)
- ``cli.py``       ``sgdsl router`` (``sgdsl serve --dp-size N`` is runtime/launcher/, above this)

The router knows workers only by their HTTP API and never imports the engine (or torch).
"""
from __future__ import annotations
