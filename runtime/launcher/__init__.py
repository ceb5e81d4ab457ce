"""``sgdsl serve``: the launcher above the server and the router.

``--dp-size 1`` (the default) runs one server (``runtime/server/cli.py``); ``--dp-size N``
starts N replica servers, each a TP group of ``--tp-size`` ranks on its own GPUs, and runs the
router (``runtime/router/``) in front of them on the public port. Dependencies point one way:
this package imports the server and the router; neither imports it.

- ``cli.py``            the ``sgdsl serve`` arguments: the server's plus ``--dp-size`` and
                        ``--router-policy``
- ``data_parallel.py``  replicas + router on one port
- ``replicas.py``       the replica processes: start, watch, stop; GPU slices
"""
from __future__ import annotations
