"""``sgdsl serve [--dp-size N] [--router-policy P] [server and engine options]``.

The server's own flags (``runtime/server/cli.py``) plus the launcher's: with ``--dp-size 1``
the rest of the command line goes to the server unchanged; with more, each replica gets it.
"""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence

from ..router.config import POLICIES, RouterConfig
from ..server import cli as server_cli


def _add_launcher_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("data parallelism")
    group.add_argument("--dp-size", type=int, default=1,
                       help="engine replicas (each a TP group of --tp-size ranks on its own "
                            "GPUs) behind a router on this port")
    group.add_argument("--router-policy", default=RouterConfig.policy, choices=POLICIES,
                       help=f"how --dp-size replicas are chosen (default: {RouterConfig.policy})")


def build_parser() -> argparse.ArgumentParser:
    """The server's parser with the launcher's flags: for ``--help`` and full validation."""
    parser = server_cli.build_parser()
    _add_launcher_flags(parser)
    return parser


def split_argv(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """The launcher's flags, and the command line without them (what a server gets)."""
    own = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    _add_launcher_flags(own)
    return own.parse_known_args(list(argv))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        argv = argv[1:]
    build_parser().parse_args(argv)  # --help, and every error named before anything starts
    launch, rest = split_argv(argv)
    if launch.dp_size == 1:
        return server_cli.main(rest)
    engine_config, server_args = server_cli.parse_args(rest)
    logging.basicConfig(level=server_args.log_level.upper())
    from .data_parallel import serve_dp

    return serve_dp(rest, engine_config, server_args, launch.dp_size, launch.router_policy)


if __name__ == "__main__":
    sys.exit(main())
