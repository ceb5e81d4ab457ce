"""SenderLink: one decode server as the prefill side sees it: the pair's process group and a
thread that runs the transfers to it one after another, in the order they were submitted
(each: the ``p2d`` notice, then the pages of every layer). On a tensor-parallel prefill server
each rank holding heads of the decode rank has one (its pages only; the first writes the
notices)."""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any

import torch

from .link import KVLayout, connect_store, device_stream, make_group, put, send_pages


@dataclass(frozen=True)
class SendJob:
    key: str
    notice: dict  # what the decode side learns: output so far, logprobs, finish, page count
    slots: torch.Tensor | None  # the pages to send (None: a notice alone)


class SenderLink:
    def __init__(self, peer: dict, store: tuple[str, int], backend: str, timeout_s: float,
                 pool: Any, done: queue.Queue, rank: int = 0,
                 heads: tuple[int, int] | None = None, notices: bool = True) -> None:
        """A prefill rank's link to one decode rank. ``heads``: the kv heads of this pool the
        peer gets from this rank (local indices; None: every head); ``notices``: this rank
        writes the peer's notices (the first of its sources, ``shards.sources``)."""
        self.peer_id = str(peer["peer"])
        self.notices = notices
        self.error: str | None = None
        mine = KVLayout.of(pool).to_json()
        start, end = heads or (0, mine["kv_heads"])
        # tp: the peer holds kv heads [start, end) of ours (and maybe others' besides)
        self.heads = None if (start, end) == (0, mine["kv_heads"]) else (int(start), int(end))
        layout = peer.get("layout") or {}
        if ({k: v for k, v in layout.items() if k != "kv_heads"} !=
                {k: v for k, v in mine.items() if k != "kv_heads"}
                or not 0 <= start < end <= mine["kv_heads"]):
            # NOTE: the group is still made: the peer waits for it
            self.error = (f"KV layouts differ: prefill {mine} (heads {start}:{end} sent), "
                          f"decode {peer.get('layout')}")
        self._host, self._store, self._backend = str(peer["host"]), store, backend
        self._group_id = f"{self.peer_id}/{rank}"
        self._timeout, self._pool, self._done = timeout_s, pool, done
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=f"pd-send-{self.peer_id[:8]}",
                                        daemon=True)
        self._thread.start()

    def submit(self, job: SendJob) -> None:
        self._jobs.put(job)

    def close(self) -> None:
        self._jobs.put(None)

    def _run(self) -> None:
        with device_stream(self._pool.device):
            try:
                store = connect_store(*self._store, self._timeout)
                group = make_group(store, self._group_id, 0, self._backend, self._host,
                                   self._timeout)
            except Exception as exc:  # noqa: BLE001 - every queued and later job fails with it
                self.error = self.error or f"no link to decode peer {self.peer_id}: {exc}"
                store = group = None
            self._serve(store, group)

    def _serve(self, store: Any, group: Any) -> None:
        seq = 0
        while (job := self._jobs.get()) is not None:
            if self.error is not None and store is None:
                self._done.put((job.key, self.error))
                continue
            notice = job.notice if self.error is None else {"key": job.key, "error": self.error}
            try:
                if self.notices:
                    put(store, f"p2d/{self.peer_id}/{seq}", notice)
                    seq += 1
                if job.slots is not None and self.error is None:
                    send_pages(group, self._pool, job.slots, peer=1,
                               host_staged=self._backend == "gloo", heads=self.heads)
                self._done.put((job.key, self.error))
            except Exception as exc:  # noqa: BLE001 - the pair is broken: fail what follows too
                self.error = f"decode peer {self.peer_id} failed: {type(exc).__name__}: {exc}"
                store = None
                self._done.put((job.key, self.error))


def notice_of(req: Any, key: str, start: int, end: int, pages: bool) -> dict:
    """What the decode side needs besides the pages: the output so far (the first token, and
    any forced tokens after it), how it finished if it did, the prompt statistics and the
    logprobs computed on the prefill server."""
    notice = {"key": key, "output_ids": list(req.output_ids), "finish_reason": req.finish_reason,
              "cached_tokens": req.cached_tokens, "forced_positions": list(req.forced_positions),
              "start": start, "count": end - start, "pages": pages}
    if req.return_logprob:
        notice.update(input_token_logprobs=req.input_token_logprobs,
                      input_top_logprobs=req.input_top_logprobs,
                      output_token_logprobs=req.output_token_logprobs,
                      output_top_logprobs=req.output_top_logprobs)
    return notice
