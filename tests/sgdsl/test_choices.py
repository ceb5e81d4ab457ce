"""The three choice methods on fixed logprob data."""
from __future__ import annotations

import pytest

from sgdsl.backends.base import ChoiceScores
from sgdsl.choices import (greedy_token_selection, token_length_normalized,
                           unconditional_likelihood_normalized)


def test_token_length_normalized_prefers_the_best_mean_not_the_best_sum():
    scores = ChoiceScores(((-1.0, -1.0, -1.0, -1.0), (-2.0,), (-0.5, -3.0)))
    # sums: -4, -2, -3.5 ; means: -1, -2, -1.75
    assert token_length_normalized(scores) == 0


def test_token_length_normalized_ties_go_to_the_first_choice():
    assert token_length_normalized(ChoiceScores(((-1.0,), (-0.5, -1.5)))) == 0


def test_greedy_token_selection_decides_at_the_first_differing_token():
    scores = ChoiceScores(((-0.1, -9.0), (-0.2, -0.1), (-0.1, -5.0)))
    # position 0 keeps choices 0 and 2; position 1 picks 2 (-5 > -9)
    assert greedy_token_selection(scores) == 2


def test_greedy_token_selection_pads_a_shorter_choice_with_its_mean():
    # choice 0 = "yes" (one token), choice 1 = "yes sir" (two tokens, same first token)
    scores = ChoiceScores(((-0.5,), (-0.5, -2.0)))
    assert greedy_token_selection(scores) == 0  # padded -0.5 beats -2.0
    assert greedy_token_selection(ChoiceScores(((-0.5,), (-0.5, -0.1)))) == 1


def test_unconditional_likelihood_normalized_uses_the_gain_from_context():
    cond = ((-1.0, -1.0), (-0.5, -0.5))
    uncond = ((-4.0, -4.0), (-0.6, -0.6))  # choice 1 is likely anyway; choice 0 gains 3/token
    scores = ChoiceScores(cond, uncond)
    assert token_length_normalized(scores) == 1
    assert unconditional_likelihood_normalized(scores) == 0
    assert unconditional_likelihood_normalized.needs_unconditional is True


def test_unconditional_method_without_unconditional_logprobs_is_an_error():
    with pytest.raises(ValueError, match="unconditional"):
        unconditional_likelihood_normalized(ChoiceScores(((-1.0,),)))
