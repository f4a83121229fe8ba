"""Sampling at a temperature on the device (gpu/devicesampling.py): a step reads
back a token id for a draw and a few candidates for a top-p row, and the tokens
are the ones the host draws from the whole row of logits, for the same seed and
position. The whole row is read back only where the candidates fall short."""

from __future__ import annotations

import numpy as np
import pytest

from gpu.devicesampling import CAP, CUT, HEADER, finish_top_p
from gpu.engine import OpenCLEngine
from gpu.sampling import sample
from runtime.scheduling.work import GREEDY, Sampling, Work

SAMPLINGS = [
    Sampling(temperature=0.7),  # a draw over the whole vocabulary, on the device
    Sampling(temperature=0.5, top_p=0.9),  # top-p: the host finishes it from the candidates
    Sampling(temperature=1.3, top_p=0.95),
    GREEDY,
]


def batch(seed: int, vocab: int) -> list[Work]:
    rng = np.random.default_rng(seed)
    works = []
    for i, sampling in enumerate(SAMPLINGS):
        n = 3 + 2 * i
        tokens = rng.integers(0, vocab, n).tolist()
        blocks = [4 * i, 4 * i + 1]
        works.append(
            Work(
                turn=i,
                tokens=tokens,
                start=0,
                block_table=blocks,
                sample=True,
                sampling=Sampling(sampling.temperature, sampling.top_p, seed + i),
            )
        )
    return works


def drawn_on_the_host(engine: OpenCLEngine, works: list[Work]) -> list[int]:
    rows = engine.step_logits(works)
    return [sample(row, w.sampling, w.start + len(w.tokens)) for row, w in zip(rows, works, strict=False)]


def test_a_step_samples_what_the_host_samples_from_the_whole_row(engine: OpenCLEngine) -> None:
    vocab = engine.config.vocab_size
    before = engine.whole_rows_read
    for seed in range(12):
        works = batch(seed, vocab)
        want = drawn_on_the_host(engine, works)
        assert engine.step(works) == want  # (the same K/V written again)
    assert engine.whole_rows_read == before  # every top-p row finished from its candidates


def test_a_top_p_row_whose_candidates_overflow_is_read_back_whole(engine: OpenCLEngine) -> None:
    vocab = engine.config.vocab_size
    kernel = engine.launches.sample.kernel
    before = engine.whole_rows_read
    kernel.set_arg(7, np.int32(2))  # room for two candidates a row
    try:
        works = batch(99, vocab)
        want = drawn_on_the_host(engine, works)
        assert engine.step(works) == want
    finally:
        kernel.set_arg(7, np.int32(CAP))
    assert engine.whole_rows_read == before + 2  # the two top-p rows


def kernel_words(logits: np.ndarray, temperature: float, cap: int = CAP) -> np.ndarray:
    """What sample_hot leaves for a top-p row, computed in NumPy (float32 as on the device)."""
    z = logits.astype(np.float32)
    top = z.max()
    total = np.float32(np.exp((z - top) * np.float32(1 / temperature)).sum(dtype=np.float32))
    ids = np.flatnonzero((z - top) * np.float32(1 / temperature) >= -CUT)
    np.random.default_rng(0).shuffle(ids)  # the device finds them in no order
    words = np.zeros(HEADER + 2 * cap, np.int32)
    words[0], words[3] = len(ids), cap
    words[1:3] = np.array([top, total], np.float32).view(np.int32)
    kept = ids[:cap]
    words[HEADER : HEADER + 2 * len(kept) : 2] = kept
    words[HEADER + 1 : HEADER + 2 * len(kept) : 2] = z[kept].view(np.int32)
    return words


@pytest.mark.parametrize("temperature, top_p", [(0.3, 0.95), (0.6, 0.9), (1.0, 0.5), (1.0, 0.99)])
def test_the_nucleus_from_the_candidates_is_the_nucleus_of_the_whole_row(temperature: float, top_p: float) -> None:
    rng = np.random.default_rng(7)
    logits = (rng.standard_normal(5000) * 3).astype(np.float32)  # 43 to 811 candidates at these temperatures
    logits[rng.integers(0, 5000, 40)] = logits.max()  # ties: equal probabilities keep id order
    words = kernel_words(logits, temperature)
    for seed in range(200):
        sampling = Sampling(temperature, top_p, seed)
        assert finish_top_p(words, sampling, 10 + seed) == sample(logits, sampling, 10 + seed)


def test_candidates_that_fall_short_of_top_p_ask_for_the_whole_row() -> None:
    rng = np.random.default_rng(7)
    logits = (rng.standard_normal(5000) * 3).astype(np.float32)
    assert kernel_words(logits, 2.0)[0] > CAP  # hot enough that most tokens are candidates: no room
    assert finish_top_p(kernel_words(logits, 2.0), Sampling(2.0, 0.8, 1), 3) is None
    logits = np.zeros(5000, np.float32)
    logits[:4] = 10.0  # 4 candidates, holding 0.95 of the mass: enough for top_p 0.5, not 0.99
    assert finish_top_p(kernel_words(logits, 1.0, cap=4), Sampling(1.0, 0.5, 1), 3) is not None
    assert finish_top_p(kernel_words(logits, 1.0, cap=4), Sampling(1.0, 0.99, 1), 3) is None
