"""Build the configured drafter; imports its module only when that algorithm is chosen."""
from __future__ import annotations

import importlib
from typing import Any

from .base import Drafter

# algorithm -> (module under runtime/speculative, class name)
_DRAFTERS = {
    "NGRAM": ("ngram", "NgramDrafter"),
    "STANDALONE": ("standalone", "StandaloneDrafter"),
    "EAGLE": ("eagle", "EagleDrafter"),
    "EAGLE3": ("eagle", "EagleDrafter"),
}


def build_drafter(config: Any, runner: Any) -> Drafter:
    """The drafter of ``config.speculative_algorithm``, as ``cls(config, runner)``."""
    module, name = _DRAFTERS[config.speculative_algorithm]
    cls = getattr(importlib.import_module(f"{__package__}.{module}"), name)
    return cls(config, runner)
