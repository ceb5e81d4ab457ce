"""Prefill/decode disaggregation (issue 27): a mode of the one scheduler, not a second one.

A prefill server (``--disaggregation-mode prefill``) runs prompts and samples each request's
first token, then ships the prompt's KV pages to the decode server the router paired it with
(``prefill.py``, ``sender.py``); a decode server (``--disaggregation-mode decode``) gives the
request slots, receives the pages and decodes (``decode.py``, ``receiver.py``). The transfer
is torch.distributed send/recv on a two-rank group per pair of ranks, with the prefill server's
TCPStore for the handshake (``link.py``, ``listener.py``; tensor parallelism on either side:
``shards.py``); the room pairing a request's halves comes from the router
through the request body (``bootstrap.py``, ``http.py``). The router's PD mode lives in
``runtime/router/pd*.py``.
"""
from __future__ import annotations

from typing import Any


def make_pd(config: Any, scheduler: Any) -> Any:
    """The scheduler's disaggregation side for ``config.disaggregation_mode`` (None: off)."""
    mode = getattr(config, "disaggregation_mode", "null")
    if mode == "null":
        return None
    backend = config.disaggregation_transfer_backend
    if backend == "auto":
        backend = "nccl" if scheduler.device.type == "cuda" else "gloo"
    if mode == "prefill":
        from .prefill import PrefillSide

        return PrefillSide(scheduler, config, backend)
    from .decode import DecodeSide

    return DecodeSide(scheduler, config, backend)
