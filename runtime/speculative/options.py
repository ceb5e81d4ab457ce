"""Validation and defaults of the ``speculative_*`` engine options (SGLang's names)."""
from __future__ import annotations

from typing import Any

from ..errors import InvalidRequestError

ALGORITHMS = ("NGRAM", "STANDALONE", "EAGLE", "EAGLE3")
DEFAULT_DRAFT_TOKENS = 4


def check_speculative(config: Any) -> None:
    """Normalise the algorithm's case and fill the derived sizes; raise on nonsense.

    Called from ``EngineConfig.__post_init__`` (a frozen dataclass: fields are set with
    ``object.__setattr__``, which is how frozen dataclasses normalise themselves)."""
    algo = config.speculative_algorithm
    if algo is None or str(algo).strip().upper() in ("", "NONE"):
        _check_unused(config)
        object.__setattr__(config, "speculative_algorithm", None)
        return
    algo = str(algo).strip().upper()
    if algo not in ALGORITHMS:
        raise _bad(config, "speculative_algorithm", f"must be one of {', '.join(ALGORITHMS)} "
                   "(any case) or None")
    object.__setattr__(config, "speculative_algorithm", algo)
    if algo != "NGRAM" and not config.speculative_draft_model_path:
        raise _bad(config, "speculative_draft_model_path",
                   f"is required with speculative_algorithm={algo}")
    _fill_sizes(config, algo)
    _check_ngram(config)
    if config.speculative_max_batch_size < 0:
        raise _bad(config, "speculative_max_batch_size", "must be >= 0")
    if not 0 <= config.speculative_min_accept_per_step:
        raise _bad(config, "speculative_min_accept_per_step", "must be >= 0")
    if not 0 <= config.speculative_min_speedup:
        raise _bad(config, "speculative_min_speedup", "must be >= 0 (0: not measured)")


def _fill_sizes(config: Any, algo: str) -> None:
    """SGLang's defaults: topk 1 (a chain), draft tokens = steps * topk + ... kept simple:
    a chain of num_steps tokens, or num_draft_tokens nodes of a topk-wide tree."""
    tokens = config.speculative_num_draft_tokens
    steps = config.speculative_num_steps
    topk = config.speculative_eagle_topk or 1
    if tokens is None:
        tokens = steps * topk if steps is not None else DEFAULT_DRAFT_TOKENS
    if steps is None:
        steps = max(tokens // topk, 1)
    for name, value in (("speculative_num_draft_tokens", tokens),
                        ("speculative_num_steps", steps), ("speculative_eagle_topk", topk)):
        if value < 1:
            raise _bad(config, name, "must be >= 1", value)
    if tokens > 64:
        raise _bad(config, "speculative_num_draft_tokens", "must be <= 64", tokens)
    if topk > 1 and algo == "STANDALONE":
        raise _bad(config, "speculative_eagle_topk", "STANDALONE drafts a chain (topk 1)", topk)
    object.__setattr__(config, "speculative_num_draft_tokens", tokens)
    object.__setattr__(config, "speculative_num_steps", steps)
    object.__setattr__(config, "speculative_eagle_topk", topk)


def _check_ngram(config: Any) -> None:
    lo = config.speculative_ngram_min_match_window_size
    hi = config.speculative_ngram_max_match_window_size
    if lo < 1:
        raise _bad(config, "speculative_ngram_min_match_window_size", "must be >= 1")
    if hi < lo:
        raise _bad(config, "speculative_ngram_max_match_window_size",
                   f"must be >= speculative_ngram_min_match_window_size={lo}")
    if config.speculative_ngram_max_bfs_breadth < 1:
        raise _bad(config, "speculative_ngram_max_bfs_breadth", "must be >= 1")


def _check_unused(config: Any) -> None:
    """Draft options without an algorithm are a mistake worth naming."""
    if config.speculative_draft_model_path:
        raise _bad(config, "speculative_draft_model_path",
                   "needs speculative_algorithm (STANDALONE, EAGLE or EAGLE3)")


def _bad(config: Any, field: str, message: str, value: Any = None) -> InvalidRequestError:
    value = getattr(config, field) if value is None else value
    return InvalidRequestError(f"{field}={value!r}: {message}", field=field)
