"""The router's PD-mode options: ``--pd-disaggregation --prefill URL [BOOTSTRAP_PORT] ...
--decode URL ...`` (SGLang's Model Gateway flags), checked and folded into ``RouterConfig``."""
from __future__ import annotations

import argparse
from typing import Any

from ..errors import InvalidRequestError
from .config import normalize_worker_url

DEFAULT_BOOTSTRAP_PORT = 8998  # SGLang's --disaggregation-bootstrap-port default
FIELDS = ("pd_disaggregation", "prefill_urls", "prefill_bootstrap_ports", "decode_urls")


def check_pd(config: Any) -> None:
    """Normalize the PD fields of a RouterConfig (frozen: set in place) and make its
    worker_urls the prefill workers then the decode workers."""
    prefill = tuple(normalize_worker_url(u, "prefill_urls") for u in config.prefill_urls)
    decode = tuple(normalize_worker_url(u, "decode_urls") for u in config.decode_urls)
    if not prefill or not decode:
        raise InvalidRequestError("pd_disaggregation needs at least one --prefill and one "
                                  "--decode worker", field="prefill_urls")
    ports = tuple(config.prefill_bootstrap_ports) or (DEFAULT_BOOTSTRAP_PORT,) * len(prefill)
    if len(ports) != len(prefill) or not all(isinstance(p, int) and 0 < p < 65536
                                             for p in ports):
        raise InvalidRequestError("prefill_bootstrap_ports: one port in 1..65535 per prefill "
                                  f"worker, got {ports!r}", field="prefill_bootstrap_ports")
    if set(prefill) & set(decode):
        raise InvalidRequestError("a worker cannot be both a prefill and a decode worker",
                                  field="decode_urls")
    for name, value in (("prefill_urls", prefill), ("decode_urls", decode),
                        ("prefill_bootstrap_ports", ports)):
        object.__setattr__(config, name, value)
    if not config.worker_urls:
        object.__setattr__(config, "worker_urls", prefill + decode)


def add_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("prefill/decode disaggregation")
    group.add_argument("--pd-disaggregation", action="store_true",
                       help="send each request to a prefill and a decode worker")
    group.add_argument("--prefill", nargs="+", action="append", default=[],
                       metavar=("URL", "BOOTSTRAP_PORT"),
                       help=f"a prefill worker and its bootstrap port (default "
                            f"{DEFAULT_BOOTSTRAP_PORT}); repeatable")
    group.add_argument("--decode", action="append", default=[], metavar="URL",
                       help="a decode worker; repeatable")


def take(ns: dict[str, Any]) -> dict[str, Any]:
    """The RouterConfig fields of the parsed flags (removed from ``ns``)."""
    prefill = ns.pop("prefill")
    decode = ns.pop("decode")
    on = ns.pop("pd_disaggregation")
    urls, ports = [], []
    for entry in prefill:
        if len(entry) > 2:
            raise InvalidRequestError(f"--prefill takes URL [BOOTSTRAP_PORT], got {entry}",
                                      field="prefill_urls")
        urls.append(entry[0])
        try:
            ports.append(int(entry[1]) if len(entry) == 2 else DEFAULT_BOOTSTRAP_PORT)
        except ValueError as exc:
            raise InvalidRequestError(f"--prefill {entry[0]}: bad bootstrap port {entry[1]!r}",
                                      field="prefill_bootstrap_ports") from exc
    if (prefill or decode) and not on:
        raise InvalidRequestError("--prefill/--decode need --pd-disaggregation",
                                  field="pd_disaggregation")
    return {"pd_disaggregation": on, "prefill_urls": tuple(urls),
            "prefill_bootstrap_ports": tuple(ports), "decode_urls": tuple(decode)}
