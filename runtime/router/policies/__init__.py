"""Routing policies behind one interface (``base.Policy``); ``make_policy`` builds one by name."""
from __future__ import annotations

import random as _random

from ..config import RouterConfig
from .base import Choice, Policy
from .cache_aware import CacheAwarePolicy
from .cost_aware import CostAwarePolicy
from .power_of_two import PowerOfTwoPolicy
from .prefix_hash import PrefixHashPolicy
from .random import RandomPolicy
from .round_robin import RoundRobinPolicy

_POLICIES: dict[str, type[Policy]] = {p.name: p for p in (
    CostAwarePolicy, CacheAwarePolicy, RoundRobinPolicy, RandomPolicy, PowerOfTwoPolicy,
    PrefixHashPolicy)}

__all__ = ["Choice", "Policy", "make_policy"]


def make_policy(config: RouterConfig, rng: _random.Random | None = None) -> Policy:
    """The policy ``config.policy`` names (RouterConfig already checked the name)."""
    return _POLICIES[config.policy](config, rng)
