"""Token and cost accounting for one program run (shared by its forks)."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Mapping

_COUNTED = ("prompt_tokens", "completion_tokens", "cached_tokens")


@dataclass
class Usage:
    """Mutable totals; ``add`` is called once per backend call with that call's meta_info."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cost: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, meta: Mapping[str, Any]) -> None:
        with self._lock:
            self.calls += 1
            for key in _COUNTED:
                setattr(self, key, getattr(self, key) + int(meta.get(key) or 0))
            self.cost += float(meta.get("cost") or 0.0)

    def as_dict(self) -> dict[str, Any]:
        with self._lock:
            return {"calls": self.calls, "prompt_tokens": self.prompt_tokens,
                    "completion_tokens": self.completion_tokens,
                    "total_tokens": self.prompt_tokens + self.completion_tokens,
                    "cached_tokens": self.cached_tokens, "cost": self.cost}
