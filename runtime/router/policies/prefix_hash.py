"""``prefix_hash``: consistent hashing of the prompt's first ``prefix_chars`` characters onto a
ring with ``virtual_nodes`` points per worker. Prompts sharing that prefix land on one worker;
adding or removing a worker moves only about 1/N of the prefixes, and a worker that is down
is skipped clockwise (its prefixes go to the next worker on the ring, the others stay)."""
from __future__ import annotations

import bisect
import hashlib
from typing import Sequence

from ..worker import Worker
from .base import Choice, Policy


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"),
                                          digest_size=8).digest(), "big")


class PrefixHashPolicy(Policy):
    name = "prefix_hash"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.ring: list[tuple[int, str]] = []

    def on_add(self, url: str) -> None:
        points = [(_hash(f"{url}#{i}"), url) for i in range(self.config.virtual_nodes)]
        self.ring = sorted(self.ring + points)

    def on_remove(self, url: str) -> None:
        self.ring = [p for p in self.ring if p[1] != url]

    def owner(self, text: str, urls: set[str]) -> str | None:
        """The first ring point clockwise of the prefix's hash whose worker is in ``urls``."""
        if not self.ring:
            return None
        start = bisect.bisect_left(self.ring, (_hash(text[:self.config.prefix_chars]), ""))
        for k in range(len(self.ring)):
            url = self.ring[(start + k) % len(self.ring)][1]
            if url in urls:
                return url
        return None

    def select(self, workers: Sequence[Worker], text: str, output_tokens: int = 0) -> Choice:
        by_url = {w.url: w for w in workers}
        url = self.owner(text, set(by_url))
        if url is None:  # not on the ring (never registered): stay deterministic anyway
            return Choice(workers[_hash(text[:self.config.prefix_chars]) % len(workers)], "hash")
        return Choice(by_url[url], "hash")
