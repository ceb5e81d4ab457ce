"""Runtime's server command line (the subprocess itself is exercised in tests/e2e)."""
from __future__ import annotations

import sys

from sgdsl.backends.runtime import SERVER_MODULE, free_port, server_command
from sgdsl.runtime.server.cli import parse_args


def test_options_become_flags_the_server_parses():
    cmd = server_command("/m", "127.0.0.1", 4321, {"max_total_tokens": 4096,
                                                   "disable_radix_cache": True,
                                                   "served_model_name": None,
                                                   "disable_cuda_graph": False})
    assert cmd[:3] == [sys.executable, "-m", SERVER_MODULE]
    engine, server = parse_args(cmd[3:])
    assert (server.host, server.port) == ("127.0.0.1", 4321)
    assert engine.model == "/m" and engine.max_total_tokens == 4096
    assert engine.disable_radix_cache is True and engine.disable_cuda_graph is False


def test_free_port_is_bindable():
    import socket

    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
