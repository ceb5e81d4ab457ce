"""xgrammar's threads and batch calls: one batch filler per calling thread (fills many
matchers' rows with its own native threads), a pool for accepts and row filters split over rows
(native code and numpy release the GIL), and the batch accept. Sized by
``SGDSL_GRAMMAR_FILL_THREADS`` or half the cores."""
from __future__ import annotations

import threading
from typing import Any, Sequence

import numpy as np


def and_rows(words: Any, rows: Sequence[int], filt: Any) -> None:
    """``words[r] &= filt`` for the sorted ``rows``, in place over runs of adjacent rows.
    NOTE: numpy, not torch (see base.allocate_bitmask); a fancy-indexed ``&=`` copies the rows
    out and back. Many rows are split over the accept pool (numpy releases the GIL): one
    thread took ~1 ms for 256 rows on the H100 host, on the path to the sampling launch."""
    runs, start = [], 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or rows[i] != rows[i - 1] + 1:
            runs.append((rows[start], rows[i - 1] + 1))
            start = i
    step = max(MIN_ACCEPT_CHUNK, -(-len(rows) // fill_threads()))
    spans = [(lo, min(lo + step, end)) for first, end in runs for lo in range(first, end, step)]

    def run(span: tuple[int, int]) -> None:
        np.bitwise_and(words[span[0]:span[1]], filt, out=words[span[0]:span[1]])
    if len(spans) == 1:
        run(spans[0])
    else:
        list(accept_pool().map(run, spans))


def spans_by_weight(weights: Sequence[int], parts: int) -> list[tuple[int, int]]:
    """``parts`` (or fewer) consecutive index spans of about equal total weight."""
    share, spans, start, acc = sum(weights) / parts, [], 0, 0
    for i, w in enumerate(weights):
        acc += w
        if acc >= share * (len(spans) + 1) and len(spans) < parts - 1:
            spans.append((start, i + 1))
            start = i + 1
    if start < len(weights):
        spans.append((start, len(weights)))
    return spans


def batch_accept(matchers: Sequence[Any], tokens: Sequence[int]) -> Sequence[int]:
    """``xgrammar.BatchGrammarMatcher.batch_accept_token``: 1 (accepted) or 0 per matcher.

    NOTE: xgrammar 0.2.8's wrapper reads the native result one index at a time (a length
    call and a bounds check per row: 0.6 ms for 256 rows on the dev box, holding the GIL
    against the other grammar thread); one slice reads it in 0.05 ms."""
    core = _core_accept()
    if core is None:
        import xgrammar as xgr

        return xgr.BatchGrammarMatcher.batch_accept_token(list(matchers), list(tokens))
    return core([m._handle for m in matchers], list(tokens), False)[:]


def _core_accept() -> Any:
    """xgrammar's native batch accept, or None where this xgrammar lays it out otherwise."""
    global _CORE_ACCEPT
    if _CORE_ACCEPT is False:
        try:
            from xgrammar.base import _core

            _CORE_ACCEPT = _core.BatchGrammarMatcher.batch_accept_token
        except (ImportError, AttributeError):
            _CORE_ACCEPT = None
    return _CORE_ACCEPT


_CORE_ACCEPT: Any = False  # not looked up yet
_FILLERS = threading.local()


def batch_filler() -> Any:
    """This thread's xgrammar.BatchGrammarMatcher (fills many rows with its own threads). One
    per thread: the prefetch job and the scheduler thread fill rows of one step at once."""
    filler = getattr(_FILLERS, "filler", None)
    if filler is None:
        import xgrammar as xgr

        filler = _FILLERS.filler = xgr.BatchGrammarMatcher(fill_threads())
    return filler


MIN_ACCEPT_CHUNK = 16  # rows per accept task: below this a thread hop costs more than it saves
# NOTE: fewer rows are accepted in one native call on the calling thread: jump-forward accepts
# its forced tokens one position at a time for ~30 requests (256 decoding, H100 host), and
# the pool's round trips (~150 us of waiting per task) cost more than the accepts themselves
MIN_THREADED_ACCEPT = 64
MIN_THREADED_TOKENS = 32  # tokens per task of a multi-token accept (accept_tokens_batch)
_ACCEPT_POOL: Any = None


def accept_pool() -> Any:
    global _ACCEPT_POOL
    if _ACCEPT_POOL is None:
        import concurrent.futures as cf

        _ACCEPT_POOL = cf.ThreadPoolExecutor(fill_threads(), thread_name_prefix="sgdsl-accept")
    return _ACCEPT_POOL


def fill_threads() -> int:
    """Threads of the batch filler: half the cores (the scheduler, tokenizer and compile
    workers keep the rest), at least 1; SGDSL_GRAMMAR_FILL_THREADS overrides."""
    import os

    env = os.environ.get("SGDSL_GRAMMAR_FILL_THREADS")
    return max(1, int(env) if env else (os.cpu_count() or 2) // 2)
