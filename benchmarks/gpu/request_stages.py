"""Per-request stages of the server path (issue 29: what the device waits for at a burst's two
ends), for ``burst_timeline.py --stages``.

Every request of a burst is stamped by its rid at each stage of the main process (the server's
loop and the engine's loop share one clock) and, from the scheduler's step trace
(``$SGDSL_STEP_TRACE``, wall-clock ``at`` per iteration), when the scheduler handled the message
that carried it. Stages, arrival (the client's post to the scheduler's queue):

- ``client->app``: the client's post until the server's app takes it (connect, bytes, HTTP parse,
  and the wait behind the other requests of the loop's turn),
- ``app->parsed``: the body read, parsed and validated,
- ``parsed->submit``: the route's request building (sampling checks, the Engine's spec),
- ``submit->handoff``: waiting for its group's hand-off (submitter.py),
- ``handoff->tm_send``: the hop to the engine's loop, tracking and the message to the scheduler,
- ``tm_send->sched``: the IPC and the scheduler taking the message (until it handled it);

finish (the scheduler's output to the client's answer):

- ``sched->recv``: the output message to the engine's loop (IPC, unpickle),
- ``recv->settled``: the answer built (text, the schema backstop, the result dict) and handed to
  the server's loop,
- ``settled->written``: the server's loop rendering and writing the response,
- ``written->client``: the client reading it.

A request's ``arrival`` is client post -> scheduler handled, ``scheduler`` from there to the
output message that finished it (queue, prefill, decode), ``finish`` scheduler sent -> client
has it. Printed as median / max over a round's requests (the max is the request the
device waited for at that end).
"""
from __future__ import annotations

import contextvars
import json
import os
import statistics
import time
from typing import Any

ARRIVAL = ("client", "app", "parsed", "submit", "handoff", "tm_send", "sched")
FINISH = ("sched_out", "recv", "settled", "written", "client_recv")
_BOX: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("stages_box",
                                                                             default=None)
STAMPS: dict[str, dict[str, float]] = {}  # rid -> stage -> wall time (this server process)
_FUTURES: dict[int, str] = {}  # id(submitter future) -> rid


def instrument(wrap: Any) -> None:
    """Hook the server process's stages (``wrap(owner, attr, before=, after=)`` as
    burst_timeline's ``_wrap``)."""
    from sgdsl.runtime import submitter
    from sgdsl.runtime.ipc import messages as m
    from sgdsl.runtime.ipc.channel import AsyncChannel
    from sgdsl.runtime.server import hot_routes
    from sgdsl.runtime.tokenizer.manager import TokenizerManager

    def parsed(*_: Any) -> None:
        box = _BOX.get()
        if box is not None:
            box["parsed"] = time.time()

    def submitted(future: Any, _self: Any, spec: Any) -> None:
        box = _BOX.get()
        stamps = STAMPS.setdefault(spec.rid, {})
        if box is not None:
            stamps.update(app=box["app"], parsed=box.get("parsed", box["app"]))
            box["rid"] = spec.rid
        stamps["submit"] = time.time()
        _FUTURES[id(future)] = spec.rid

    def handed(self: Any) -> None:
        now = time.time()
        for spec, fut in self._pending:
            STAMPS.setdefault(spec.rid, {})["handoff"] = now

    def sent(_self: Any, specs: Any, *_: Any) -> None:
        now = time.time()
        for spec in specs:
            STAMPS.setdefault(spec.rid, {})["tm_send"] = now

    def received(msg: Any, *_: Any, **__: Any) -> None:
        if isinstance(msg, m.BatchTokenOut):
            now = time.time()
            for out in msg.outs:
                if out.finish_reason is not None:
                    stamps = STAMPS.setdefault(out.rid, {})
                    stamps.update(recv=now, sched_out=msg.sent_at or now)

    def settled(slot: Any, *_: Any) -> None:
        rid = _FUTURES.pop(id(slot.future), None)
        if rid is not None:
            STAMPS.setdefault(rid, {})["settled"] = time.time()

    wrap(hot_routes, "_validated", after=parsed)
    wrap(submitter.Submitter, "submit", after=submitted)
    wrap(submitter.Submitter, "_flush", before=handed)
    wrap(TokenizerManager, "submit", before=sent)
    wrap(AsyncChannel, "recv", after=received)
    wrap(submitter._Slot, "put_nowait", before=settled)


def app_entered() -> dict[str, Any]:
    """At the app's entry for a request (the hot routes' ASGI call): its box of stamps."""
    box = {"app": time.time()}
    _BOX.set(box)
    return box


def written(box: dict[str, Any]) -> None:
    rid = box.get("rid")
    if rid is not None:
        STAMPS.setdefault(rid, {})["written"] = time.time()


def take() -> dict[str, dict[str, float]]:
    out = dict(STAMPS)
    STAMPS.clear()
    return out


def scheduler_handled(trace_dir: str, since: float) -> list[float]:
    """Wall times (after ``since``) at which the scheduler handled incoming messages."""
    path = os.path.join(trace_dir, "steps-rank0.jsonl")
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            at = row.get("at")
            if at is not None and row.get("msgs") and at >= since:
                out.append(at + row.get("handle_ms", 0.0) / 1e3)
    return sorted(out)


def report(title: str, stamps: dict[str, dict[str, float]], client: dict[str, tuple],
           handled: list[float]) -> dict[str, list[float]]:
    """Print the stage table of one round; ``client``: rid -> (sent, received) by the client;
    ``handled``: the scheduler's message-handling times (the first at or after a request's
    tm_send is when it reached the queue). Returns the per-stage ms lists."""
    spans: dict[str, list[float]] = {}
    for rid, (sent, got) in client.items():
        s = dict(stamps.get(rid, {}), client=sent, client_recv=got)
        if "tm_send" in s:
            s["sched"] = next((t for t in handled if t >= s["tm_send"]), float("nan"))
        for names in (ARRIVAL, FINISH):
            for a, b in zip(names, names[1:]):
                if a in s and b in s:
                    spans.setdefault(f"{a}->{b}", []).append(1e3 * (s[b] - s[a]))
        for name, (a, b) in (("ARRIVAL", ("client", "sched")),
                             ("SCHEDULER", ("sched", "sched_out")),
                             ("FINISH", ("sched_out", "client_recv"))):
            if a in s and b in s:
                spans.setdefault(name, []).append(1e3 * (s[b] - s[a]))
    print(f"\n{title}: per-request stages, ms (median / max over {len(client)} requests)")
    for name, ms in spans.items():
        ms = [x for x in ms if x == x]  # NaN: no trace row found
        if ms:
            print(f"  {name:20s} {statistics.median(ms):8.2f} / {max(ms):8.2f}", flush=True)
    return spans
