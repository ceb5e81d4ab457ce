"""The router's Prometheus metrics on a registry of its own: requests, retries, errors and
policy decisions per worker; worker load, health and breaker state read at scrape time."""
from __future__ import annotations

from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .breaker import STATE_CODES

PREFIX = "sgdsl_router"
_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class _WorkerCollector(Collector):
    def __init__(self, snapshot: Callable[[], tuple[list[Any], dict[str, int]]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Any]:
        workers, tree_chars = self._snapshot()
        load = GaugeMetricFamily(f"{PREFIX}_worker_load", "Requests in flight per worker",
                                 labels=["worker"])
        healthy = GaugeMetricFamily(f"{PREFIX}_worker_healthy", "1 if the worker's health "
                                    "checks pass", labels=["worker"])
        circuit = GaugeMetricFamily(f"{PREFIX}_worker_circuit_state",
                                    "Circuit breaker: 0 closed, 1 half-open, 2 open",
                                    labels=["worker"])
        work = GaugeMetricFamily(f"{PREFIX}_worker_work_tokens", "Tokens of work the router "
                                 "believes each worker has left (prefill + decode: its last "
                                 "/load report + requests routed since)", labels=["worker"])
        tree = GaugeMetricFamily(f"{PREFIX}_cache_tree_chars", "Characters in the cache_aware "
                                 "policy's tree of each worker", labels=["worker"])
        for w in workers:
            load.add_metric([w.url], w.load)
            work.add_metric([w.url], w.ledger.work(1.0))
            healthy.add_metric([w.url], 1.0 if w.healthy else 0.0)
            circuit.add_metric([w.url], STATE_CODES[w.breaker.state])
        for url, chars in tree_chars.items():
            tree.add_metric([url], chars)
        yield from (load, work, healthy, circuit, tree)
        yield GaugeMetricFamily(f"{PREFIX}_workers", "Registered workers", value=len(workers))


class RouterMetrics:
    def __init__(self, snapshot: Callable[[], tuple[list[Any], dict[str, int]]] | None = None
                 ) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(f"{PREFIX}_requests", "Proxied requests by route, worker and "
                                "status", ["route", "worker", "status"], registry=r)
        self.retries = Counter(f"{PREFIX}_retries", "Attempts retried on another worker",
                               ["route"], registry=r)
        self.worker_errors = Counter(f"{PREFIX}_worker_errors", "Failed attempts per worker "
                                     "and kind", ["worker", "kind"], registry=r)
        self.failed = Counter(f"{PREFIX}_failed_requests", "Requests that failed after all "
                              "attempts or mid-stream", ["route", "reason"], registry=r)
        self.decisions = Counter(f"{PREFIX}_policy_decisions", "Worker choices per policy, "
                                 "worker and reason", ["policy", "worker", "reason"], registry=r)
        self.latency = Histogram(f"{PREFIX}_request_duration_seconds", "Time to the response's "
                                 "end, per route", ["route"], buckets=_BUCKETS, registry=r)
        if snapshot is not None:
            r.register(_WorkerCollector(snapshot))

    def render(self) -> bytes:
        return generate_latest(self.registry)
