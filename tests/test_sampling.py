"""Sampling: greedy is argmax, seeded draws are a pure function of (logits, seed, position), and
the draws follow the softmax restricted to the nucleus."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from gpu.sampling import probabilities, sample, uniform
from runtime.scheduling.work import GREEDY, Sampling

V = 49152


def big_logits(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 3, size=V).astype(np.float32)


def test_greedy_is_argmax() -> None:
    logits = big_logits()
    assert sample(logits, GREEDY, 0) == int(np.argmax(logits))
    assert sample(logits, Sampling(temperature=0.0, top_p=0.5, seed=9), 123) == int(np.argmax(logits))


def test_greedy_ties_go_to_the_lowest_id() -> None:
    logits = np.zeros(10, dtype=np.float32)
    logits[[7, 3, 5]] = 2.0
    assert sample(logits, GREEDY, 0) == 3


@settings(max_examples=100, deadline=None)
@given(arrays(np.float32, st.integers(1, 300), elements=st.floats(-50, 50, width=32)))
def test_greedy_matches_argmax_on_any_logits(logits: np.ndarray) -> None:
    assert sample(logits, GREEDY, 0) == int(np.argmax(logits))


def test_seeded_sampling_is_reproducible() -> None:
    logits = big_logits()
    s = Sampling(temperature=1.0, top_p=0.95, seed=1234)
    first = [sample(logits, s, pos) for pos in range(50)]
    again = [sample(logits.copy(), s, pos) for pos in range(50)]
    assert first == again
    # evaluated out of order (as a resumed turn would be) the draws are the same
    assert [sample(logits, s, pos) for pos in reversed(range(50))] == first[::-1]


def test_draws_depend_on_position_and_seed() -> None:
    logits = np.zeros(1000, dtype=np.float32)  # uniform: every draw is one of 1000 ids
    s = Sampling(temperature=1.0, seed=7)
    by_position = {sample(logits, s, pos) for pos in range(40)}
    by_seed = {sample(logits, Sampling(temperature=1.0, seed=seed), 5) for seed in range(40)}
    assert len(by_position) > 30 and len(by_seed) > 30
    assert uniform(7, 3) != uniform(7, 4) and uniform(7, 3) != uniform(8, 3)
    assert 0.0 <= uniform(2**70, -1) < 1.0  # out-of-range seeds and positions wrap, not crash


def test_tiny_top_p_is_argmax() -> None:
    logits = big_logits(3)
    for pos in range(30):
        assert sample(logits, Sampling(temperature=1.0, top_p=1e-6, seed=pos), pos) == int(np.argmax(logits))


def test_high_temperature_spreads() -> None:
    logits = np.linspace(0.0, 5.0, 50).astype(np.float32)
    cold = {sample(logits, Sampling(temperature=0.005, seed=1), pos) for pos in range(200)}
    hot = {sample(logits, Sampling(temperature=100.0, seed=1), pos) for pos in range(200)}
    assert cold == {49}
    assert len(hot) > 35


def test_top_p_never_leaves_the_nucleus() -> None:
    # probabilities 0.5, 0.25, 0.125, ... : top_p=0.8 keeps exactly the first three
    logits = np.log(0.5 ** np.arange(1, 21)).astype(np.float32)
    order = np.random.default_rng(0).permutation(20)
    shuffled = np.empty_like(logits)
    shuffled[order] = logits  # token order[i] has probability 0.5^(i+1)
    drawn = {sample(shuffled, Sampling(temperature=1.0, top_p=0.8, seed=3), pos) for pos in range(300)}
    assert drawn == {int(order[0]), int(order[1]), int(order[2])}


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_draws_follow_the_softmax(top_p: float) -> None:
    logits = np.array([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0], dtype=np.float32)
    temperature = 0.8
    p = probabilities(logits, temperature)
    if top_p < 1.0:  # the nucleus: best tokens until their mass reaches top_p, renormalised
        keep = np.searchsorted(np.cumsum(p), top_p) + 1
        p = np.where(np.arange(p.size) < keep, p, 0.0)
        p /= p.sum()
    n = 20000
    s = Sampling(temperature=temperature, top_p=top_p, seed=42)
    counts = np.bincount([sample(logits, s, pos) for pos in range(n)], minlength=logits.size)
    assert np.all(counts[p == 0] == 0)
    support = p > 0
    expected = n * p[support]
    chi2 = float(((counts[support] - expected) ** 2 / expected).sum())
    # dof <= 7; chi2 > 40 has probability < 1e-5 for a correct sampler (and seeds are fixed)
    assert chi2 < 40.0, (counts, expected)
