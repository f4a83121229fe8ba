"""Pick the next token from a row of logits: greedy, or temperature + top-p (nucleus).

Sampling is a pure function of (logits, sampling, position). The one random number a draw uses
comes from a counter-based generator keyed by the turn's seed and the position, so a turn paused,
swapped out and resumed draws exactly what it would have drawn unpaused, whatever else shared
its batches.

`position` is the position the sampled token will occupy in the turn's sequence: the k-th new
token after an n-token prompt (k from 0) is sampled with position n + k. For a forward pass over
tokens at positions start..start+m-1 that samples from its last logits, position = start + m.
"""

from __future__ import annotations

import numpy as np

from runtime.scheduling.work import Sampling

_FIRST_CANDIDATES = 64  # top-p looks at this many best tokens first, and doubles if short


def uniform(seed: int, position: int) -> float:
    """The draw in [0, 1) for (seed, position): Philox keyed by the seed, counter = position."""
    key = seed & 0xFFFF_FFFF_FFFF_FFFF
    rng = np.random.Generator(np.random.Philox(key=key, counter=position & 0xFFFF_FFFF_FFFF_FFFF))
    return float(rng.random())


def sample(logits: np.ndarray, sampling: Sampling, position: int) -> int:
    logits = np.asarray(logits).reshape(-1)
    if sampling.greedy:
        return int(np.argmax(logits))  # the lowest index among equal maxima
    return _sample_top_p(logits, sampling, position)


def probabilities(logits: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(logits / temperature) in float64."""
    z = np.asarray(logits, dtype=np.float64) / temperature
    z -= z.max()
    p = np.exp(z)
    return p / p.sum()


def _sample_top_p(logits: np.ndarray, sampling: Sampling, position: int) -> int:
    p = probabilities(logits, sampling.temperature)
    u = uniform(sampling.seed, position)
    if sampling.top_p >= 1.0:
        return pick_from(np.arange(p.size), p, u)
    nucleus = _nucleus(p, sampling.top_p)
    return pick_from(nucleus, p[nucleus], u)


def _nucleus(p: np.ndarray, top_p: float) -> np.ndarray:
    """The fewest most-probable token ids whose probabilities sum to at least top_p, best first
    (ties broken by lower id). Looks at a few candidates first instead of sorting the whole vocab;
    a flat distribution falls back to one full sort."""
    k = min(_FIRST_CANDIDATES, p.size)
    while True:
        if 4 * k >= p.size:
            top = np.argsort(-p, kind="stable")  # stable: equal probabilities keep id order
        else:
            top = np.sort(np.argpartition(-p, k - 1)[:k])
            top = top[np.argsort(-p[top], kind="stable")]
        cumulative = np.cumsum(p[top])
        if cumulative[-1] >= top_p or top.size == p.size:
            n = int(np.searchsorted(cumulative, top_p)) + 1  # include the token crossing top_p
            return top[: min(n, top.size)]
        k *= 8


def pick_from(ids: np.ndarray, weights: np.ndarray, u: float) -> int:
    """The id where the running sum of `weights` first passes u times their total."""
    cumulative = np.cumsum(weights)
    i = int(np.searchsorted(cumulative, u * cumulative[-1], side="right"))
    return int(ids[min(i, ids.size - 1)])
