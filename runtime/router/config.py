"""RouterConfig: every option of the router in one frozen dataclass, validated on creation.

The default policy is cost_aware (least expected work, see policies/cost_aware.py). Defaults of
the cache-aware policy follow SGLang's Model Gateway (cache_threshold 0.3,
balance_abs_threshold 64, balance_rel_threshold 1.5) with a per-worker tree bounded in characters.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ..errors import InvalidRequestError

POLICIES = ("cost_aware", "cache_aware", "round_robin", "random", "power_of_two", "prefix_hash")


def normalize_worker_url(url: Any, field: str = "url") -> str:
    """``http(s)://host:port`` without a trailing slash; a clear error naming ``field`` else."""
    if not isinstance(url, str) or not url.strip():
        raise InvalidRequestError(f"{field}: a worker URL is required (http://HOST:PORT)",
                                  field=field)
    text = url.strip().rstrip("/")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise InvalidRequestError(f"{field}: invalid worker URL {url!r}: {exc}", field=field) from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidRequestError(
            f"{field}: invalid worker URL {url!r}: expected http://HOST:PORT or https://HOST:PORT",
            field=field)
    if parts.path or parts.query or parts.fragment:
        raise InvalidRequestError(f"{field}: invalid worker URL {url!r}: no path or query allowed",
                                  field=field)
    if port == 0:
        raise InvalidRequestError(f"{field}: invalid worker URL {url!r}: port 0", field=field)
    return text


@dataclass(frozen=True)
class RouterConfig:
    """How the router listens, chooses workers, retries and checks health."""

    worker_urls: tuple[str, ...] = ()
    policy: str = "cost_aware"
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None  # required from clients on every route but /health
    worker_api_key: str | None = None  # sent to workers instead of the client's credentials
    # cost_aware (least expected work: uncached prompt tokens + the worker's work left)
    chars_per_token: float = 4.0  # converts the text tree's characters to tokens
    decode_token_weight: float = 1.0  # cost of an output token in prompt-token units
    evict_weight: float = 1.0  # extra cost of a miss on a full KV (it evicts cached prefixes)
    # queued work above the lightest worker's that is not counted against cache affinity, as a
    # fraction of the mean work (widened by the lightest worker's KV pressure). 2: at dp=2 only a
    # worker running dry (few requests in flight) takes a group from its cache; 0.5 overflowed
    # from full batches near their end (router_sim.py, 3 seeds: fits 1.02x -> 1.12x round robin,
    # dp4 1.20x -> 1.31x, kv 1.30x either way; the perfect partition 1.13x / 1.34x / 1.34x)
    work_slack: float = 2.0
    # a worker with at most this x the mean requests in flight is running dry: its band is then
    # at most twice its own work (a very large value judges every worker dry: the rule before
    # 2026-11-28, with work_slack 0.5)
    dry_fraction: float = 0.5
    default_output_tokens: int = 128  # a request's output estimate when it names no maximum
    # How often each worker's GET /load is polled. On the H200 kv runs cost_aware's router used
    # 6.7-6.9 CPU s per ~22 s round at 0.05 s, cache_aware's (no polls) 3.7-4.2 s: ~3 ms per poll
    # if the polls are the difference. Between polls the router's own bookings keep the picture
    # current (the simulator's ratios do not move from 0.05 to 0.2 s).
    load_interval_s: float = 0.1
    # cache_aware (approximate radix tree of the text routed to each worker; also cost_aware's)
    cache_threshold: float = 0.3  # match ratio above which the best-matching worker wins
    balance_abs_threshold: int = 64  # imbalanced if max_load - min_load > this ...
    balance_rel_threshold: float = 1.5  # ... and max_load > this * min_load
    max_tree_chars: int = 1 << 22  # per worker; LRU leaves are evicted beyond it
    # prefix_hash (consistent hashing on the first characters of the prompt)
    prefix_chars: int = 256
    virtual_nodes: int = 160
    # retries, before the first byte reached the client
    max_retries: int = 3
    backoff_base_s: float = 0.05
    backoff_max_s: float = 2.0
    # timeouts (a dead or hung worker never holds a request forever)
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 600.0  # longest silence between two chunks of a worker's answer
    # How long an idle client connection stays open. Longer than clients' own pool expiry
    # (httpx 5 s, aiohttp 15 s, as nginx's 75 s): at uvicorn's 5 s the router closed idle
    # connections just as a 5 s client pool reused them, and the request got a reset.
    keep_alive_timeout_s: float = 75.0
    # health checks and the circuit breaker
    health_interval_s: float = 5.0
    health_timeout_s: float = 5.0
    health_failure_threshold: int = 2  # consecutive failed checks that mark a worker down
    health_success_threshold: int = 1  # consecutive good checks that bring it back
    breaker_failure_threshold: int = 5  # consecutive failed requests that open the breaker
    breaker_success_threshold: int = 2  # good trial requests that close it again
    breaker_cooldown_s: float = 10.0  # how long it stays open before a trial request
    max_body_bytes: int = 32 * 1024 * 1024
    log_level: str = "warning"
    # pd: prefill/decode disaggregation (router/pd_proxy.py): each request goes to a prefill
    # worker (chosen by ``policy``) and a decode worker (least loaded); worker_urls is then
    # the prefill workers followed by the decode workers.
    pd_disaggregation: bool = False
    prefill_urls: tuple[str, ...] = ()
    prefill_bootstrap_ports: tuple[int, ...] = ()  # one per prefill URL
    decode_urls: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.pd_disaggregation:  # pd:
            from .pd_config import check_pd

            check_pd(self)
        urls = tuple(normalize_worker_url(u, "worker_urls") for u in self.worker_urls)
        if len(set(urls)) != len(urls):
            raise InvalidRequestError("worker_urls: duplicate worker URL", field="worker_urls")
        object.__setattr__(self, "worker_urls", urls)
        if self.policy not in POLICIES:
            raise InvalidRequestError(f"policy: unknown policy {self.policy!r}; choose one of "
                                      f"{', '.join(POLICIES)}", field="policy")
        _check_range("cache_threshold", self.cache_threshold, 0.0, 1.0)
        _check_range("balance_rel_threshold", self.balance_rel_threshold, 1.0, None)
        _check_range("chars_per_token", self.chars_per_token, 0.1, None)
        _check_range("decode_token_weight", self.decode_token_weight, 0.0, None)
        _check_range("evict_weight", self.evict_weight, 0.0, None)
        _check_range("work_slack", self.work_slack, 0.0, None)
        _check_range("dry_fraction", self.dry_fraction, 0.0, None)
        for name in ("balance_abs_threshold", "max_retries", "default_output_tokens"):
            _check_range(name, getattr(self, name), 0, None)
        for name in ("max_tree_chars", "prefix_chars", "virtual_nodes", "health_failure_threshold",
                     "health_success_threshold", "breaker_failure_threshold",
                     "breaker_success_threshold", "max_body_bytes"):
            _check_range(name, getattr(self, name), 1, None)
        for name in ("backoff_base_s", "backoff_max_s", "connect_timeout_s", "read_timeout_s",
                     "health_interval_s", "health_timeout_s", "breaker_cooldown_s",
                     "load_interval_s", "keep_alive_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                raise InvalidRequestError(f"{name}: must be a positive number of seconds, "
                                          f"got {value!r}", field=name)
        if not 0 <= self.port <= 65535:
            raise InvalidRequestError(f"port: must be in 0..65535, got {self.port}", field="port")

    def replace(self, **changes: Any) -> "RouterConfig":
        return dataclasses.replace(self, **changes)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def _check_range(name: str, value: Any, low: float, high: float | None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequestError(f"{name}: must be a number, got {value!r}", field=name)
    if value < low or (high is not None and value > high):
        limit = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise InvalidRequestError(f"{name}: must be {limit}, got {value}", field=name)
