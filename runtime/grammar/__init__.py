"""Grammar-constrained decoding: per-request matchers (``base.Grammar``) from a backend
(xgrammar by default, or outlines-core), compiled by ``compiler.GrammarCompiler`` with a cache,
size limits, a deadline and a memory budget, in killable worker processes (``worker_pool.py``),
never in the scheduler's process. docs/grammar.md describes the guarantees.

Importing this package does not import xgrammar or outlines; ``create_grammar_backend`` does.
"""
from .base import (ANY_JSON, Grammar, GrammarBackend, GrammarKey, allocate_bitmask,
                   bitmask_width, choices_regex)
from .compiler import GrammarCompiler, PendingGrammar
from .jump_forward import JumpForward, jump_forward, only_stop_allowed
from .limits import GrammarLimits
from .registry import create_grammar_backend

__all__ = [
    "ANY_JSON", "Grammar", "GrammarBackend", "GrammarCompiler", "GrammarKey", "GrammarLimits",
    "JumpForward", "PendingGrammar", "allocate_bitmask", "bitmask_width", "choices_regex",
    "create_grammar_backend", "jump_forward", "only_stop_allowed",
]
