"""``sgdsl router --worker-urls URL [URL ...] --policy cache_aware --port 30000``.

Every RouterConfig field is a flag (``--cache-threshold``, ``--max-retries``...), so a new router
option is a new flag without touching this file.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import sys
import typing
from typing import Any, Callable, Sequence

from .. import hop_times  # hops:
from ..errors import InvalidRequestError
from . import pd_config
from .config import POLICIES, RouterConfig


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sgdsl router", description=__doc__.splitlines()[0])
    parser.add_argument("--worker-urls", nargs="*", default=[], metavar="URL",
                        help="workers to route to (more can be added at run time: /add_worker)")
    parser.add_argument("--policy", choices=POLICIES, default=RouterConfig.policy)
    hints = typing.get_type_hints(RouterConfig)
    pd_config.add_flags(parser)  # pd:
    for f in dataclasses.fields(RouterConfig):
        if f.name in ("worker_urls", "policy") or f.name in pd_config.FIELDS:
            continue
        kind = _scalar(hints[f.name])
        parser.add_argument("--" + f.name.replace("_", "-"), type=kind, default=f.default,
                            help=f"default: {f.default}")
    return parser


def _scalar(hint: Any) -> Any:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    base = args[0] if args else hint
    return base if base in (int, float) else str


def parse_args(argv: Sequence[str]) -> RouterConfig:
    ns = vars(build_parser().parse_args(list(argv)))
    ns["worker_urls"] = tuple(ns["worker_urls"])
    pd = pd_config.take(ns)  # pd:
    return RouterConfig(**ns, **pd)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["router"]:
        argv = argv[1:]
    try:
        config = parse_args(argv)
    except InvalidRequestError as exc:
        print(f"sgdsl router: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=config.log_level.upper())
    serve(config)
    return 0


def serve(config: RouterConfig, announce: Callable[[str], str] | None = None,
          on_shutdown: Callable[[], None] | None = None) -> None:
    """Run the router until SIGINT/SIGTERM. Once it listens it prints ``announce(url)`` (by
    default ``sgdsl router listening on URL (...)``)."""
    import uvicorn

    from .app import create_app

    app = create_app(config, on_shutdown)
    hop_times.watch_gc("router")  # hops: long collections on stderr ($SGDSL_HOP_TIMES)

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started:
                # NOTE: a full collection walked the ~70k objects of the imports and the app
                # (~100 ms on the loaded 2-core dev box), a pause of every stream relayed
                # here; frozen, later collections walk only what came after startup.
                gc.collect()
                gc.freeze()
                port = self.servers[0].sockets[0].getsockname()[1] if self.servers else config.port
                url = config.replace(port=port).url
                line = announce(url) if announce else (
                    f"sgdsl router listening on {url} ({config.policy}, "
                    f"{len(config.worker_urls)} workers)")
                print(line, flush=True)

    uvicorn_config = uvicorn.Config(app, host=config.host, port=config.port,
                                    log_level=config.log_level, access_log=False,
                                    timeout_keep_alive=config.keep_alive_timeout_s)
    Server(uvicorn_config).run()


if __name__ == "__main__":
    sys.exit(main())
