"""The prefill server's listener: the thread (on rank 0) that reads what decode processes
write to its control store, ``reg/1``, ``reg/2``... (peers announcing themselves,
registrations), in order, into the prefill side's inbox (``prefill.py``)."""
from __future__ import annotations

import datetime
import json
import queue
import time
from typing import Callable

from .link import STORE_WAIT_S, connect_store

# NOTE: a reg/<n> key still missing this long after later ones exist was reserved by a decode
# process that died before writing it: skipped, or it would stall every registration after it.
SKIP_MISSING_S = 5.0


def listen(port: int, timeout_s: float, inbox: queue.Queue, stop: Callable[[], bool]) -> None:
    store = connect_store("127.0.0.1", port, timeout_s)
    n, missing_since = 1, None
    while not stop():
        key = f"reg/{n}"
        try:
            store.wait([key], datetime.timedelta(seconds=STORE_WAIT_S))
        except RuntimeError:  # timed out: is an earlier reservation never written?
            if int(store.add("reg_n", 0)) > n:
                missing_since = missing_since or time.monotonic()
                if time.monotonic() - missing_since > SKIP_MISSING_S:
                    n, missing_since = n + 1, None
            continue
        inbox.put(json.loads(store.get(key)))
        store.delete_key(key)
        n, missing_since = n + 1, None
