"""Start one Engine behind the HTTP server (``python -m sgdsl.runtime.server``).

``sgdsl serve`` is runtime/launcher/cli.py: these flags plus ``--dp-size`` replicas behind the
router.

Engine options are generated from ``EngineConfig``'s fields (``--max-total-tokens``,
``--schedule-policy``...), so a new engine option is a new flag without touching this file.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import typing
from typing import Any, Sequence

from .. import hop_times  # hops:
from ..config import EngineConfig
from ..fast_exit import exit_without_teardown
from .args import ServerArgs

_SERVER_FLAGS = {"host", "port", "api_key", "cors_origins", "graceful_timeout_s",
                 "keep_alive_timeout_s", "max_body_bytes", "log_level", "tool_call_parser",
                 "reasoning_parser"}


def _add_engine_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("engine")
    hints = typing.get_type_hints(EngineConfig)
    for f in dataclasses.fields(EngineConfig):
        if f.name in ("model", "log_level"):
            continue
        flag = "--" + f.name.replace("_", "-")
        hint = hints[f.name]
        if hint is bool:
            group.add_argument(flag, action="store_true", default=f.default)
            continue
        choices = _literal_choices(hint)
        kind = _scalar_type(hint)
        group.add_argument(flag, type=kind, choices=choices, default=f.default,
                           help=f"default: {f.default}")


def _literal_choices(hint: Any) -> list[Any] | None:
    if typing.get_origin(hint) is typing.Literal:
        return list(typing.get_args(hint))
    return None


def _scalar_type(hint: Any) -> Any:
    """int/float/str of a (possibly Optional or Literal) annotation."""
    if typing.get_origin(hint) is typing.Literal:
        return type(typing.get_args(hint)[0])
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    base = args[0] if args else hint
    return base if base in (int, float) else str


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sgdsl serve", description=__doc__.splitlines()[0])
    parser.add_argument("--model", "--model-path", dest="model", default=None,
                        help="HF directory, GGUF file or hub id; default: the embedded SmolLM2")
    parser.add_argument("--host", default=ServerArgs.host)
    parser.add_argument("--port", type=int, default=ServerArgs.port, help="0 picks a free port")
    parser.add_argument("--api-key", default=None,
                        help="required on every route but /health (Bearer or x-api-key)")
    parser.add_argument("--cors-origin", dest="cors_origins", action="append", default=[],
                        help="allow this origin (repeatable; CORS is off without it)")
    parser.add_argument("--graceful-timeout-s", type=float, default=ServerArgs.graceful_timeout_s,
                        help="on SIGTERM, how long to wait for in-flight requests")
    parser.add_argument("--keep-alive-timeout-s", type=float,
                        default=ServerArgs.keep_alive_timeout_s,
                        help="how long an idle client connection stays open")
    parser.add_argument("--max-body-bytes", type=int, default=ServerArgs.max_body_bytes)
    parser.add_argument("--log-level", default="warning")
    parser.add_argument("--tool-call-parser", default=None,
                        choices=["hermes", "qwen", "qwen25", "qwen3", "llama3", "mistral"],
                        help="tool-call format of the model (default: from its chat template)")
    parser.add_argument("--reasoning-parser", default=None, choices=["qwen3", "deepseek-r1"],
                        help="separate the model's <think> section as reasoning_content")
    _add_engine_options(parser)
    return parser


def parse_args(argv: Sequence[str]) -> tuple[EngineConfig, ServerArgs]:
    ns = vars(build_parser().parse_args(list(argv)))
    server = ServerArgs(**{k: ns.pop(k) for k in list(ns) if k in _SERVER_FLAGS
                           and k != "cors_origins"}, cors_origins=tuple(ns.pop("cors_origins")))
    engine = EngineConfig.from_kwargs(**ns, log_level=server.log_level)
    return engine, server


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until SIGINT/SIGTERM; in-flight requests drain, then the engine shuts down and the
    process exits with 0 (without the interpreter's teardown: fast_exit.py)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        argv = argv[1:]
    engine_config, server_args = parse_args(argv)
    logging.basicConfig(level=server_args.log_level.upper())
    if engine_config.node_rank > 0:  # a further node of a multi-node TP group: no HTTP
        from ..distributed.node import run_node

        return run_node(engine_config)
    from ..engine import Engine  # heavy (torch): only once the arguments are known good

    engine = Engine(engine_config)
    try:
        _serve(engine, server_args)
    finally:
        engine.shutdown()
    # NOTE: drained and shut down (the scheduler and its workers gone): the process only has
    # its heap left to collect, seconds of CPU for nothing (fast_exit.py). Never returns.
    exit_without_teardown(0)


def _serve(engine: Any, args: ServerArgs) -> None:
    import uvicorn

    from .app import create_app

    app = create_app(engine, args, on_shutdown=engine.shutdown)
    name = app.state.ctx.model_name
    hop_times.watch_gc("server")  # hops: long collections on stderr ($SGDSL_HOP_TIMES)

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started:
                port = self.servers[0].sockets[0].getsockname()[1] if self.servers else args.port
                url = dataclasses.replace(args, port=port).url
                print(f"sgdsl server listening on {url} (model: {name})", flush=True)

    Server(uvicorn_config(app, args)).run()


def uvicorn_config(app: Any, args: ServerArgs) -> Any:
    """uvicorn's settings from the server's flags."""
    import uvicorn

    from .intake import http_protocol

    return uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                          timeout_graceful_shutdown=args.graceful_timeout_s, access_log=False,
                          timeout_keep_alive=args.keep_alive_timeout_s, http=http_protocol(app))
