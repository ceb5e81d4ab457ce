"""``CompileJob``: one key's compile, from its submission to its result (the worker pool's
unit of work, ``worker_pool.py``; the disk loader completes some from their files), and
``CompileTimeout``, the failure of one stopped at its deadline.
"""
from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field

from ...errors import InvalidRequestError
from ..base import GrammarKey


@dataclass(eq=False)
class CompileJob:
    """One compile; ``future``'s result is (compiled grammar, the bytes it holds here, seconds
    it took) or an ``InvalidRequestError``."""

    key: GrammarKey
    submitted: float  # time.monotonic()
    future: Future = field(default_factory=Future)
    started: float | None = None  # when a worker took it; its deadline counts from here
    # False: the JSON meta-schema check already passed where the request was built (the
    # Engine's front end), so the worker skips it (compiler.submit's ``meta_checked``)
    meta_check: bool = True


class CompileTimeout(InvalidRequestError):
    """A compile stopped at its deadline (the compiler remembers its key as too slow)."""

