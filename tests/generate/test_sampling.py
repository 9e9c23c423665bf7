"""The host's choice of the next token (generate/sampling.py), against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from neuronx_cc_lite.generate.sampling import Sampler

LOGITS = np.array([0.5, 3.0, 2.5, -1.0, 2.9, 0.0], np.float32)


def test_greedy_takes_the_largest_and_the_first_of_equals():
    assert Sampler("greedy")(LOGITS) == 1
    assert Sampler("greedy")(np.array([1.0, 4.0, 4.0])) == 1


def test_top_k_draws_only_the_k_likeliest_in_their_proportions():
    sampler = Sampler("top-k", top_k=3, seed=0)
    draws = np.array([sampler(LOGITS) for _ in range(4000)])
    assert set(draws) == {1, 2, 4}
    p = np.exp(LOGITS[[1, 2, 4]] - 3.0)
    p /= p.sum()
    np.testing.assert_allclose([np.mean(draws == t) for t in (1, 2, 4)], p, atol=0.03)


def test_top_p_keeps_the_fewest_that_reach_p():
    p = np.exp(LOGITS - LOGITS.max())
    p /= p.sum()  # sorted: 1 (0.36), 4 (0.33), 2 (0.22), ...
    sampler = Sampler("top-p", top_p=0.6, seed=0)
    assert {sampler(LOGITS) for _ in range(500)} == {1, 4}
    assert {Sampler("top-p", top_p=0.3, seed=0)(LOGITS) for _ in range(50)} == {1}


def test_temperature_sharpens_and_the_seed_repeats():
    cold = Sampler("top-k", top_k=6, temperature=0.01, seed=1)
    assert {cold(LOGITS) for _ in range(50)} == {1}
    first = [Sampler("top-p", top_p=0.95, seed=9)(LOGITS) for _ in range(1)]
    again = Sampler("top-p", top_p=0.95, seed=9)
    assert [again(LOGITS)] == first


@pytest.mark.parametrize("kwargs", [{"mode": "beam"}, {"top_k": 0}, {"top_p": 0.0}, {"top_p": 1.5},
                                    {"temperature": 0.0}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        Sampler(**kwargs)
