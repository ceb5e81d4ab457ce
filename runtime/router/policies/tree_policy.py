"""The base of the policies that keep an approximate prefix tree per worker (``cache_aware``,
``cost_aware``): a ``TextTree`` of the text routed to each worker, made and dropped as workers
come and go, and reported in ``/list_workers`` and ``/metrics``."""
from __future__ import annotations

from .base import Policy
from .text_tree import TextTree


class TreePolicy(Policy):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.trees: dict[str, TextTree] = {}

    def tree(self, url: str) -> TextTree:
        tree = self.trees.get(url)
        if tree is None:
            tree = self.trees[url] = TextTree(self.config.max_tree_chars)
        return tree

    def on_add(self, url: str) -> None:
        self.tree(url)

    def on_remove(self, url: str) -> None:
        self.trees.pop(url, None)

    def describe(self) -> dict:
        return {"policy": self.name, "tree_chars": {u: t.size for u, t in self.trees.items()}}
