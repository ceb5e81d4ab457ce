"""Grammar-constrained decoding: per-request matchers (``base.Grammar``) from a backend
(xgrammar by default, or outlines-core), compiled by ``compile.compiler.GrammarCompiler`` with a
cache, size limits, a deadline and a memory budget, in killable worker processes
(``compile/worker_pool.py``), never in the scheduler's process. docs/grammar.md describes the
guarantees.

Layout (each subpackage's docstring says what it owns): ``base.py`` the interface,
``vocab.py`` token bytes, ``registry.py`` backends by name, ``manager.py`` + ``steps.py`` the
scheduler's handle (admission side, per-step side), ``prefetch.py`` mask fills on a helper
thread; ``schema/`` JSON Schema rewrites, ``compile/`` compiling, ``backends/`` xgrammar and
outlines, ``guards/`` facts a backend does not enforce, ``forcing/`` text appended unsampled.
Imports point one way: schema/ imports no sibling; guards/ -> schema/; backends/ -> guards/;
compile/ -> schema/; forcing/ -> compile/ (its estimate worker), guards/; the top-level manager,
steps and registry use the subpackages, and no subpackage imports them.

Importing this package does not import xgrammar or outlines; ``create_grammar_backend`` does.
"""
from .base import (ANY_JSON, Grammar, GrammarBackend, GrammarKey, allocate_bitmask,
                   bitmask_width, choices_regex)
from .compile.compiler import GrammarCompiler, PendingGrammar
from .forcing.jump_forward import JumpForward, jump_forward, only_stop_allowed
from .compile.limits import GrammarLimits
from .registry import create_grammar_backend

__all__ = [
    "ANY_JSON", "Grammar", "GrammarBackend", "GrammarCompiler", "GrammarKey", "GrammarLimits",
    "JumpForward", "PendingGrammar", "allocate_bitmask", "bitmask_width", "choices_regex",
    "create_grammar_backend", "jump_forward", "only_stop_allowed",
]
