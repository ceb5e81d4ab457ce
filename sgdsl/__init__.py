"""sgdsl: a structured-generation language for LLM programs (SGLang-compatible frontend).

``import sgdsl as sgl`` runs SGLang programs unchanged. Importing this package never imports
torch, openai or anthropic: the backend classes (``OpenAI``, ``Anthropic``, ``RuntimeEndpoint``,
``Runtime``, ``Local``) are loaded from ``sgdsl.backends`` on first use.
"""
from __future__ import annotations

from typing import Any

from sgdsl.api import (assistant, assistant_begin, assistant_end, commit_lazy, entrypoint,
                       flush_cache, function, gen, gen_int, gen_string, get_server_info, image,
                       select, separate_reasoning, set_default_backend, system, system_begin,
                       system_end, user, user_begin, user_end)
from sgdsl.choices import (greedy_token_selection, token_length_normalized,
                           unconditional_likelihood_normalized)
from sgdsl.errors import (BackendConfigError, BackendError, ConstraintViolationError,
                          ProgramCancelledError, SgdslError, UnsupportedError)
from sgdsl.function import SglFunction
from sgdsl.ir import REGEX_BOOL, REGEX_FLOAT, REGEX_INT, REGEX_STR
from sgdsl.state import ProgramState, ProgramStateGroup
from sgdsl.tools import ToolCall, run_tools, tool_results

__version__ = "0.1.0"
_LAZY_BACKENDS = ("OpenAI", "Anthropic", "RuntimeEndpoint", "Runtime", "Local")

__all__ = [
    "Anthropic", "BackendConfigError", "BackendError", "ConstraintViolationError", "Local",
    "OpenAI", "ProgramCancelledError", "ProgramState", "ProgramStateGroup", "REGEX_BOOL",
    "REGEX_FLOAT", "REGEX_INT", "REGEX_STR", "Runtime", "RuntimeEndpoint", "SgdslError",
    "SglFunction", "ToolCall", "UnsupportedError", "assistant", "assistant_begin",
    "assistant_end", "commit_lazy", "entrypoint", "flush_cache", "function", "gen", "gen_int",
    "gen_string", "get_server_info", "greedy_token_selection", "image", "run_tools", "select",
    "separate_reasoning", "set_default_backend", "system", "system_begin", "system_end",
    "token_length_normalized", "tool_results", "unconditional_likelihood_normalized", "user",
    "user_begin", "user_end",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY_BACKENDS:
        import sgdsl.backends as backends  # noqa: PLC0415

        return getattr(backends, name)
    raise AttributeError(f"module 'sgdsl' has no attribute {name!r}")
