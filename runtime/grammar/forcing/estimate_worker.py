"""The completion-estimate worker process: searches shortest completions (``shortest.py``) for
the forced-completion tracker of its parent's scheduler (``estimate.py`` is the parent's side).

Why a process: the search is Python (a move per expansion, tens per answer). On a helper
thread of the scheduler's process it held the GIL while the scheduler thread wanted it back
for the sampling and forward launches; measured on the H100 host at 32 constrained rows, the
sampling launch took 1.2-2.3 ms of host time instead of 0.55 (benchmarks/RESULTS.md). Here it
shares nothing with the scheduler.

Started like a compile worker (a fresh interpreter, ``worker_handle.WorkerHandle``) and talks
over its pipes in the same length-prefixed pickle frames:

- parent -> worker, once: ``EstimateInit``; worker -> parent: ``("ready", None)`` or
  ``("startup_error", message)``.
- parent -> worker: ``("grammar", gid, key)``: a ``GrammarKey`` that just compiled in a compile
  worker (within its deadline and memory limit), known from then on as ``gid``; compiled here
  at once (read from the on-disk cache instead where its file is there: ``disk_cache.py``),
  while its request waits for its prefill. The last
  ``_KEYS`` keys and ``_COMPILED`` compiled grammars are kept (least recently used dropped;
  a dropped grammar is compiled again when a job needs it).
- parent -> worker: ``("job", job_id, gid, token_ids, deep)``: a fresh matcher of grammar
  ``gid`` is advanced by ``token_ids`` (the request's output so far) and searched, then
  ``search_deep`` if asked and nothing was found; worker -> parent: ``(job_id, completion,
  None)``, the completion None when none was found, or ``(job_id, None, reason)`` when the job
  could not run (an unknown gid, tokens the grammar rejects, an error's text).
"""
from __future__ import annotations

import sys
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..compile.worker import serve, set_process_name

_KEYS = 1024  # grammar keys kept
# NOTE: each compiled within the compile workers' memory limit there; a few are enough (a
# batch rarely mixes many schemas), and fewer bound what this unlimited process holds
_COMPILED = 8


@dataclass(frozen=True)
class EstimateInit:
    """What the worker needs: the backend's picklable factory (``registry.BackendSpec``) and
    the search's settings (``CompletionSearch``'s)."""

    factory: Callable[[], Any]
    tokenizer: Any
    vocab_size: int
    stop_ids: tuple[int, ...]
    max_expansions: int
    deep_seconds: float
    disk: Any = None  # the engine's GrammarDiskCache, or None


class _Estimator:
    def __init__(self, init: EstimateInit) -> None:
        from .shortest import CompletionSearch

        self.backend = init.factory()
        self.disk = init.disk
        self.search = CompletionSearch(init.tokenizer, init.vocab_size, init.stop_ids,
                                       max_expansions=init.max_expansions,
                                       deep_seconds=init.deep_seconds)
        self.keys: OrderedDict[int, Any] = OrderedDict()  # gid -> GrammarKey
        self.compiled: OrderedDict[int, Any] = OrderedDict()  # gid -> compiled grammar
        # NOTE: built now (the tokenizer's bytes per token, ~0.1-0.5 s at a 128k vocabulary):
        # the parent waits ANSWER_WAIT_S at most for an answer, and a first job paying for it
        # was answered too late (measured on the H100 host)
        from ..guards.unique_keys import build_quote_tokens

        self.quotes = build_quote_tokens(init.tokenizer, init.vocab_size)

    def add(self, gid: int, key: Any) -> None:
        self.keys[gid] = key
        _bound(self.keys, _KEYS)
        try:
            self._compiled(gid)
        except BaseException:
            del self.keys[gid]  # its jobs answer "unknown" rather than compile it again
            raise

    def run(self, job_id: int, gid: int, token_ids: Sequence[int], deep: bool) -> tuple:
        compiled = self._compiled(gid)
        if compiled is None:
            return (job_id, None, f"grammar {gid} unknown")
        grammar = self._matcher(self.keys[gid], compiled)
        if not grammar.accept_tokens(token_ids):
            return (job_id, None, "the grammar rejects the output")
        found = self.search.fresh(grammar)
        if found is None and deep:
            found = self.search.search_deep(grammar, len(token_ids))
        return (job_id, found, None)

    def _compiled(self, gid: int) -> Any:
        if gid not in self.keys:
            return None
        compiled = self.compiled.get(gid)
        if compiled is None:
            compiled = self.compiled[gid] = self._load_or_compile(self.keys[gid])
            _bound(self.compiled, _COMPILED)
        self.compiled.move_to_end(gid)
        self.keys.move_to_end(gid)
        return compiled

    def _load_or_compile(self, key: Any) -> Any:
        """The compiled grammar from the on-disk cache (a restarted engine's grammars are
        there), else compiled here."""
        payload = self.disk.load(key) if self.disk is not None else None
        if payload is not None:
            try:
                return self.backend.receive(payload)  # what a compile worker shipped
            except Exception as e:  # noqa: BLE001 - compiled below instead
                print(f"estimate worker: cached grammar does not load: {e}", file=sys.stderr)
        return self.backend.compile(key)

    def _matcher(self, key: Any, compiled: Any) -> Any:
        """A fresh matcher as the parent's manager makes one (unique keys guarded alike)."""
        from ..guards.unique_keys import guard_keys

        return guard_keys(self.backend.new_grammar(compiled), key, self.quotes,
                          self.backend.name)


def _bound(table: OrderedDict, size: int) -> None:
    while len(table) > size:
        table.popitem(last=False)


def _handle(estimator: _Estimator, message: tuple) -> tuple | None:
    if message[0] == "grammar":
        try:
            estimator.add(*message[1:])
        except Exception as e:  # noqa: BLE001 - its jobs fail alike: searched by the parent
            print(f"estimate worker: grammar {message[1]}: {type(e).__name__}: {e}",
                  file=sys.stderr)
        return None
    try:
        return estimator.run(*message[1:])
    except Exception as e:  # noqa: BLE001 - an estimate: the parent searches itself
        return (message[1], None, f"{type(e).__name__}: {e}")


def main() -> None:
    set_process_name("sgdsl-estimate")
    serve(_Estimator, _handle)


if __name__ == "__main__":
    main()
