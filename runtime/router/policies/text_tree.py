"""An approximate radix tree over the *text* of the prompts routed to one worker (characters,
not tokens: the router never tokenizes), as in SGLang's Model Gateway. It predicts what the
worker's prefix cache holds; its size is bounded in characters and the least recently used
leaves are evicted first."""
from __future__ import annotations

import heapq


class _Node:
    __slots__ = ("key", "children", "parent", "last_access")

    def __init__(self, key: str, parent: "_Node | None", tick: int) -> None:
        self.key = key  # the edge label from the parent
        self.children: dict[str, _Node] = {}
        self.parent = parent
        self.last_access = tick


def _common_len(key: str, text: str, start: int) -> int:
    """Length of the common prefix of ``key`` and ``text[start:]``.
    NOTE: a binary search over slice comparisons (done in C), not a character loop: keys of
    long system prompts are thousands of characters."""
    seg = text[start:start + len(key)]
    if seg == key:
        return len(key)
    low, high = 0, min(len(key), len(seg))  # key[:low] == seg[:low]; the first high differ
    while low < high:
        mid = (low + high + 1) // 2
        if key[low:mid] == seg[low:mid]:
            low = mid
        else:
            high = mid - 1
    return low


class TextTree:
    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self.root = _Node("", None, 0)
        self.size = 0  # characters stored
        self._tick = 0

    def match(self, text: str) -> int:
        """How many leading characters of ``text`` the tree holds."""
        node, i = self.root, 0
        while i < len(text):
            child = node.children.get(text[i])
            if child is None:
                break
            k = _common_len(child.key, text, i)
            i += k
            if k < len(child.key):
                break
            node = child
        return i

    def insert(self, text: str) -> None:
        """Add ``text`` (marking its whole path as just used), then evict beyond the bound."""
        self._tick += 1
        node, i = self.root, 0
        while i < len(text):
            node.last_access = self._tick
            child = node.children.get(text[i])
            if child is None:
                node.children[text[i]] = _Node(text[i:], node, self._tick)
                self.size += len(text) - i
                break
            k = _common_len(child.key, text, i)
            if k < len(child.key):
                child = self._split(node, child, k)
            i += k
            node = child
        node.last_access = self._tick
        if self.size > self.max_chars:
            self.evict(self.max_chars - self.max_chars // 10)

    def _split(self, parent: _Node, child: _Node, k: int) -> _Node:
        mid = _Node(child.key[:k], parent, child.last_access)
        parent.children[mid.key[0]] = mid
        child.key = child.key[k:]
        child.parent = mid
        mid.children[child.key[0]] = child
        return mid

    def evict(self, target_chars: int) -> None:
        """Drop least recently used leaves until at most ``target_chars`` remain.
        NOTE: eviction works in batches (down to 90% of the bound) so its cost is amortized."""
        heap = [(n.last_access, id(n), n) for n in self._leaves()]
        heapq.heapify(heap)
        while self.size > target_chars and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[0]]
            self.size -= len(leaf.key)
            if parent is not self.root and not parent.children:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))

    def _leaves(self) -> list[_Node]:
        leaves, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                leaves.append(node)
        return leaves
