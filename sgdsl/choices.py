"""The three ways ``select`` turns per-token logprobs into a decision, as pure functions.

Each takes a ``ChoiceScores`` (one tuple of token logprobs per choice, given the context) and
returns the index of the chosen option; ties go to the earliest choice. A method that needs the
choices scored *without* the context says so with ``needs_unconditional = True`` so a backend
asks for those logprobs too.
"""
from __future__ import annotations

from typing import Sequence

from sgdsl.backends.base import ChoiceScores


def _mean(values: Sequence[float]) -> float:
    # NOTE: an empty choice has no tokens to judge; 0.0 (log 1) keeps it comparable.
    return sum(values) / len(values) if values else 0.0


def _argmax(values: Sequence[float]) -> int:
    best = 0
    for i, value in enumerate(values):
        if value > values[best]:
            best = i
    return best


def token_length_normalized(scores: ChoiceScores) -> int:
    """The choice with the highest mean token logprob (SGLang's default)."""
    return _argmax([_mean(lp) for lp in scores.token_logprobs])


def greedy_token_selection(scores: ChoiceScores) -> int:
    """Compare choices token by token, keeping only the best at each position, until one is
    left. A shorter choice is extended with its own mean logprob so that a choice that is a
    prefix of a longer one can still be compared position by position."""
    rows = [list(lp) for lp in scores.token_logprobs]
    width = max((len(r) for r in rows), default=0)
    padded = [r + [_mean(r)] * (width - len(r)) for r in rows]
    alive = list(range(len(rows)))
    for pos in range(width):
        best = max(padded[i][pos] for i in alive)
        alive = [i for i in alive if padded[i][pos] == best]
        if len(alive) == 1:
            break
    return alive[0]


greedy_token_selection.needs_unconditional = False  # type: ignore[attr-defined]
token_length_normalized.needs_unconditional = False  # type: ignore[attr-defined]


def unconditional_likelihood_normalized(scores: ChoiceScores) -> int:
    """The choice whose tokens gain the most from the context: mean of
    (conditional - unconditional) token logprobs. Favors answers the context makes likely over
    answers that are likely anyway."""
    if scores.unconditional_logprobs is None:
        raise ValueError("unconditional_likelihood_normalized needs unconditional logprobs")
    gains = [_mean([c - u for c, u in zip(cond, uncond)])
             for cond, uncond in zip(scores.token_logprobs, scores.unconditional_logprobs)]
    return _argmax(gains)


unconditional_likelihood_normalized.needs_unconditional = True  # type: ignore[attr-defined]
