"""Pick a grammar backend by name (``EngineConfig.grammar_backend``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..errors import InvalidRequestError
from .base import GrammarBackend


def _xgrammar(tokenizer: Any, vocab_size: int, eos: Sequence[int]) -> GrammarBackend:
    from .backends.xgrammar import XGrammarBackend

    return XGrammarBackend(tokenizer, vocab_size, eos)


def _outlines(tokenizer: Any, vocab_size: int, eos: Sequence[int]) -> GrammarBackend:
    from .backends.outlines import OutlinesBackend

    return OutlinesBackend(tokenizer, vocab_size, eos)


GRAMMAR_BACKENDS: dict[str, Callable[[Any, int, Sequence[int]], GrammarBackend]] = {
    "xgrammar": _xgrammar,
    "outlines": _outlines,
}


@dataclass(frozen=True)
class BackendSpec:
    """How a compile worker rebuilds a backend: pickled once per worker at its start (an HF
    tokenizer pickles in ~15 ms, far cheaper than loading it from disk again)."""

    name: str
    tokenizer: Any
    vocab_size: int
    eos_token_ids: tuple[int, ...]

    def __call__(self) -> GrammarBackend:
        return GRAMMAR_BACKENDS[self.name](self.tokenizer, self.vocab_size,
                                           list(self.eos_token_ids))


def create_grammar_backend(name: str, tokenizer: Any, vocab_size: int,
                           eos_token_ids: Sequence[int] | None = None) -> GrammarBackend | None:
    """The backend called ``name`` for this tokenizer; None for ``"none"`` (constraints off).

    ``eos_token_ids`` default to the tokenizer's eos token; they are the tokens a grammar
    allows once its text is complete.
    """
    if name == "none":
        return None
    if name not in GRAMMAR_BACKENDS:
        raise InvalidRequestError(
            f"unknown grammar backend {name!r}; choose one of {sorted(GRAMMAR_BACKENDS)} or 'none'",
            field="grammar_backend")
    if eos_token_ids is None:
        eos = getattr(tokenizer, "eos_token_id", None)
        eos_token_ids = [eos] if isinstance(eos, int) else list(eos or [])
    if not eos_token_ids:
        raise InvalidRequestError("the tokenizer has no eos token; pass eos_token_ids",
                                  field="grammar_backend")
    backend = GRAMMAR_BACKENDS[name](tokenizer, vocab_size, list(eos_token_ids))
    backend.spec = BackendSpec(name, tokenizer, vocab_size, tuple(eos_token_ids))
    return backend
