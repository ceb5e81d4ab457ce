"""The grammar interface: what the scheduler and the sampler see of constrained decoding.

Three pieces, one per lifetime:

- ``GrammarKey`` — what a request asks for: ``(kind, text)``; the cache key of a compiled grammar.
- ``GrammarBackend`` — built once per engine from the tokenizer; compiles a key into an opaque
  compiled grammar (slow: run in worker processes by ``compiler.GrammarCompiler``, each holding
  its own backend rebuilt from ``backend.spec``; the result comes back through ``ship`` /
  ``receive``) and makes a fresh per-request ``Grammar`` from it (fast).
- ``Grammar`` — one per request: a matcher that accepts tokens, fills one row of a packed int32
  bitmask (bit ``t`` of row ``r`` set = token ``t`` allowed), reports a jump-forward string
  (text the grammar forces), termination, and rolls back.

The bitmask layout is xgrammar's (and outlines-core's): ``ceil(vocab_size / 32)`` int32 words
per row, token ``t`` at word ``t // 32``, bit ``t % 32``.
"""
from __future__ import annotations

import json
import pickle
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Literal, NamedTuple, Sequence

import torch

from ..errors import InvalidRequestError

GrammarKind = Literal["json_schema", "json_object", "regex", "ebnf", "choices"]
GRAMMAR_KINDS: tuple[str, ...] = ("json_schema", "json_object", "regex", "ebnf", "choices")
# SGLang's spelling of "any JSON value" inside json_schema; kept so its clients work unchanged.
ANY_JSON = "$$ANY$$"


@dataclass(frozen=True)
class GrammarKey:
    """A constraint as the cache sees it. ``choices`` text is a JSON list of strings."""

    kind: GrammarKind
    text: str

    @property
    def field(self) -> str:
        """The request field an error about this grammar names."""
        return "json_schema" if self.kind == "json_object" else self.kind

    @classmethod
    def from_constraint(cls, kind: str, text: Any) -> "GrammarKey":
        """Normalize a request's (kind, value): dict schemas are dumped, ``$$ANY$$`` and
        ``json_object`` mean any JSON, choices become a JSON list."""
        if kind not in GRAMMAR_KINDS:
            raise InvalidRequestError(f"unknown constraint kind {kind!r}", field=kind)
        if kind == "choices":
            return cls.choices(text)
        if kind == "json_schema" and not isinstance(text, str):
            text = json.dumps(text)
        if kind == "json_schema" and text.strip() == ANY_JSON:
            return cls("json_object", "")
        if not isinstance(text, str):
            raise InvalidRequestError(f"{kind} must be a string", field=kind)
        return cls(kind, "" if kind == "json_object" else text)  # type: ignore[arg-type]

    @classmethod
    def choices(cls, options: Sequence[str]) -> "GrammarKey":
        if isinstance(options, str) or not options or not all(
                isinstance(o, str) and o for o in options):
            raise InvalidRequestError("choices must be a non-empty list of non-empty strings",
                                      field="choices")
        return cls("choices", json.dumps(list(options)))


def choices_regex(options: Sequence[str]) -> str:
    """A fixed set of choices as a regex alternation (longest first, all escaped)."""
    import re

    ordered = sorted(dict.fromkeys(options), key=len, reverse=True)
    return "(" + "|".join(re.escape(o) for o in ordered) + ")"


def bitmask_width(vocab_size: int) -> int:
    """int32 words per bitmask row."""
    return (vocab_size + 31) // 32


def allocate_bitmask(batch_size: int, vocab_size: int, pin: bool = False,
                     init: bool = True) -> torch.Tensor:
    """A CPU int32 bitmask with every token allowed (-1 = all 32 bits set); ``pin``: in
    page-locked memory, for a non-blocking copy to the GPU. ``init=False``: rows left
    undefined, for a caller that writes every row (a fill, or ``open_rows``)."""
    bitmask = torch.empty((batch_size, bitmask_width(vocab_size)), dtype=torch.int32,
                          pin_memory=pin)
    if init:
        # NOTE: filled through numpy (one thread): a torch fill this size wakes the intra-op
        # OpenMP pool, whose spinning threads then slow the grammar's own fill threads.
        bitmask.numpy().fill(-1)
    return bitmask


def open_rows(bitmask: torch.Tensor, rows: Sequence[int]) -> None:
    """Allow every token in ``rows`` of a CPU bitmask."""
    if len(rows) == bitmask.shape[0]:
        bitmask.numpy().fill(-1)
    elif rows:
        bitmask.numpy()[list(rows)] = -1


class StateKey(NamedTuple):
    """A matcher state as far as a backend can tell cheaply. ``local``: the newest parse step
    alone (equal for the states a digit run passes through); ``full``: all the backend knows,
    which identifies the state exactly when ``Grammar.exact_state_key``; ``merge``: what the
    shortest-completion search merges states by (``full`` when None), coarser where states
    differ only in ways no shortest completion uses (the keys an object already has)."""

    local: Hashable
    full: Hashable
    merge: Hashable = None

    def merge_key(self) -> Hashable:
        return self.full if self.merge is None else self.merge


class Grammar(ABC):
    """Per-request matcher state. Not thread-safe: owned by the scheduler loop."""

    # True when ``state_key().full`` identifies the whole state (equal keys: equal futures).
    exact_state_key: bool = False
    # True when the batch accept/fill of this class is native code holding no Python state
    # shared with other requests, so it may run on a helper thread (grammar/prefetch.py).
    thread_safe_batch: bool = False

    @abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; False (state unchanged) if the grammar rejects it."""

    def accept_tokens(self, token_ids: Sequence[int]) -> bool:
        """Advance by several tokens, all or nothing."""
        for i, t in enumerate(token_ids):
            if not self.accept_token(int(t)):
                if i:
                    self.rollback(i)
                return False
        return True

    @abstractmethod
    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed-next-token set into ``bitmask[row]`` (CPU int32)."""

    # NOTE: the batch hooks take same-class grammars; a backend with native batch calls
    # (xgrammar: a thread pool filling many matchers) overrides them, others loop.
    @classmethod
    def fill_bitmask_batch(cls, grammars: Sequence["Grammar"], bitmask: torch.Tensor,
                           rows: Sequence[int]) -> None:
        """``grammars[i].fill_bitmask(bitmask, rows[i])`` for every i."""
        for grammar, row in zip(grammars, rows):
            grammar.fill_bitmask(bitmask, row)

    @classmethod
    def accept_token_batch(cls, grammars: Sequence["Grammar"],
                           token_ids: Sequence[int]) -> list[bool]:
        """``grammars[i].accept_token(token_ids[i])`` for every i."""
        return [g.accept_token(t) for g, t in zip(grammars, token_ids)]

    @classmethod
    def accept_tokens_batch(cls, grammars: Sequence["Grammar"],
                            token_lists: Sequence[Sequence[int]]) -> list[bool]:
        """``grammars[i].accept_tokens(token_lists[i])`` (all or nothing each) for every i."""
        return accept_positions(grammars, token_lists, cls.accept_token_batch)

    @abstractmethod
    def jump_forward_string(self) -> str:
        """The longest text every valid continuation starts with ("" if none). Pure."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """True once the grammar accepted a stop token (nothing more may follow)."""

    @abstractmethod
    def is_completed(self) -> bool:
        """True if the text so far is a complete match (a stop token would be accepted)."""

    @abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens."""

    def state_key(self) -> StateKey | None:
        """A summary of the matcher state; None when the backend has none. Used only to prune
        the shortest-completion search (shortest.py), never for soundness."""
        return None

    def known_completion(self) -> Sequence[int] | None:
        """Token ids that take this matcher to a complete state, read from a table its backend
        built at compile time (outlines_completion.py), no search; None where it has none. The
        search (shortest.py) replays them first, so a wrapper's own limits still hold."""
        return None

    def cache_scope(self) -> Any:
        """The compiled grammar this matcher runs (shared by every request of one key), so
        results that depend only on (compiled grammar, state) can be shared; None: no sharing."""
        return None

    @abstractmethod
    def copy(self) -> "Grammar":
        """An independent matcher in the same state (for ``n > 1`` / forks)."""

    @property
    @abstractmethod
    def num_accepted(self) -> int:
        """Tokens accepted so far (net of rollbacks)."""


def fill_bitmask_grouped(grammars: Sequence[Grammar], bitmask: torch.Tensor,
                         rows: Sequence[int]) -> None:
    """``grammars[i]`` fills ``bitmask[rows[i]]``: one ``fill_bitmask_batch`` per class."""
    for cls, idx in _by_class(grammars).items():
        cls.fill_bitmask_batch([grammars[i] for i in idx], bitmask, [rows[i] for i in idx])


def accept_token_grouped(grammars: Sequence[Grammar], token_ids: Sequence[int]) -> list[bool]:
    """``grammars[i].accept_token(token_ids[i])``: one ``accept_token_batch`` per class."""
    return _per_class(grammars, token_ids, "accept_token_batch")


def accept_tokens_grouped(grammars: Sequence[Grammar],
                          token_lists: Sequence[Sequence[int]]) -> list[bool]:
    """``grammars[i].accept_tokens(token_lists[i])`` (all or nothing each): one
    ``accept_tokens_batch`` per class."""
    return _per_class(grammars, token_lists, "accept_tokens_batch")


def _per_class(grammars: Sequence[Grammar], args: Sequence[Any], method: str) -> list[bool]:
    """``cls.<method>(grammars of cls, their args)`` per grammar class, results in order."""
    accepted = [False] * len(grammars)
    for cls, idx in _by_class(grammars).items():
        oks = getattr(cls, method)([grammars[i] for i in idx], [args[i] for i in idx])
        for i, ok in zip(idx, oks):
            accepted[i] = ok
    return accepted


def accept_positions(grammars: Sequence[Grammar], token_lists: Sequence[Sequence[int]],
                     accept_batch: Callable[[list, list], list[bool]]) -> list[bool]:
    """All-or-nothing acceptance of each list, one ``accept_batch(grammars, tokens)`` call per
    token position: the k-th tokens of every list still going in one (native) call."""
    done = [0] * len(grammars)
    going = [i for i, ids in enumerate(token_lists) if ids]
    while going:
        oks = accept_batch([grammars[i] for i in going], [token_lists[i][done[i]] for i in going])
        nxt = []
        for i, ok in zip(going, oks):
            if ok:
                done[i] += 1
                if done[i] < len(token_lists[i]):
                    nxt.append(i)
            elif done[i]:
                grammars[i].rollback(done[i])
                done[i] = -1
            else:
                done[i] = -1
        going = nxt
    return [n == len(ids) and n > 0 for n, ids in zip(done, token_lists)]


def _by_class(grammars: Sequence[Grammar]) -> dict[type, list[int]]:
    groups: dict[type, list[int]] = {}
    for i, g in enumerate(grammars):
        groups.setdefault(type(g), []).append(i)
    return groups


class GrammarBackend(ABC):
    """Compiles keys for one tokenizer. ``compile`` may be slow and runs in a worker process (on
    the backend ``spec()`` builds there); ``new_grammar`` and ``deserialize`` are cheap and run
    in the engine's process."""

    name: str = "base"
    # A picklable zero-argument factory that rebuilds this backend in a compile worker (e.g.
    # ``registry.BackendSpec``); set by whoever builds the backend.
    spec: Callable[[], "GrammarBackend"] | None = None

    def __init__(self, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(eos_token_ids)

    def serialize(self, compiled: Any) -> bytes:
        """``compile``'s result as bytes, in the worker (default: pickle)."""
        return pickle.dumps(compiled, protocol=pickle.HIGHEST_PROTOCOL)

    def deserialize(self, data: bytes) -> Any:
        """The compiled grammar back from ``serialize``'s bytes, in the engine's process."""
        return pickle.loads(data)

    # True if ``ship_again`` may make a payload cheaper to load than ``ship``'s
    ships_again: bool = False

    def ship(self, compiled: Any) -> bytes:
        """What a compile worker sends its parent for ``compile``'s result (default: the
        ``serialize``d grammar). A backend whose serialized form may cost more than compiling
        again sends what to compile instead (xgrammar: ``XGrammarBackend.ship``)."""
        return self.serialize(compiled)

    def may_ship_again(self, compiled: Any) -> bool:
        """In the worker (``ships_again``): whether ``ship_again`` is worth asking for this
        compile (the worker then keeps it until its next job)."""
        return False

    def ship_again(self, compiled: Any) -> bytes | None:
        """In the worker, asked after ``ship``'s payload was delivered (so never on a
        request's admission path), only for the on-disk cache: a payload that loads faster on
        a later start, or None. Runs under a deadline of its own; the compile has succeeded
        whatever happens here."""
        return None

    def receive(self, data: bytes) -> Any:
        """The compiled grammar, in the engine's process, from ``ship``'s bytes (default:
        ``deserialize``). Runs on a compile-pool thread, never the scheduler loop, and only for
        a key the worker compiled within its deadline and memory budget."""
        return self.deserialize(data)

    def compiled_bytes(self, compiled: Any, shipped: bytes) -> int:
        """Bytes ``compiled`` holds in this process (the compile cache's byte bound);
        default: the length of what was shipped."""
        return len(shipped)

    @abstractmethod
    def compile(self, key: GrammarKey) -> Any:
        """Compile a key; raise ``InvalidRequestError(field=key.field)`` if it cannot."""

    @abstractmethod
    def new_grammar(self, compiled: Any) -> Grammar:
        """A fresh matcher at the start of the compiled grammar."""

    def supports(self, kind: str) -> bool:
        return kind in GRAMMAR_KINDS
