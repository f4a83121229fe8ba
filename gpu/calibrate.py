"""A quick calibration of the engine's step cost law (runtime.scheduling.cost), at start-up.

A handful of steps chosen to tell the three coefficients apart: decodes of 1 to 8
turns at a short and a long context (what a batch-mate costs, what attention
reads cost) and prefill chunks of two sizes (what a prompt token costs). Each
shape runs twice and keeps the faster time: on a shared machine the slower run
is someone else's work. About a second on a 2-core CPU, far less on a GPU.

It writes K/V into blocks of the pool, which is harmless before any turn owns them.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from runtime.scheduling.cost import step_features
from runtime.scheduling.units import ceil_div
from runtime.scheduling.work import Work

BATCHES = (1, 2, 4, 8)
PREFILLS = (32, 96)


def calibration_samples(engine: Any, repeats: int = 2) -> list[tuple[int, int, float]]:
    """(tokens, kv_reads, seconds) for each calibration shape; [] if the pool is too small."""
    width = max(max(BATCHES), 2) + 1
    span = min(engine.num_blocks // width, ceil_div(400, engine.block_size))  # blocks per turn
    positions = span * engine.block_size
    if positions < 2 * max(PREFILLS):
        return []
    rng = np.random.default_rng(0)
    vocab = engine.config.vocab_size
    tables = [list(range(i * span, (i + 1) * span)) for i in range(width)]
    far = positions - 2

    def decode(batch: int, position: int) -> list[Work]:
        return [Work(turn=t, tokens=[int(rng.integers(vocab))], start=position, block_table=tables[t], sample=True) for t in range(batch)]

    def prefill(n: int, start: int = 0) -> list[Work]:
        return [Work(turn=width - 1, tokens=rng.integers(0, vocab, n).tolist(), start=start, block_table=tables[-1], sample=True)]

    shapes = [decode(b, p) for p in (16, far) for b in BATCHES] + [prefill(n) for n in PREFILLS] + [prefill(PREFILLS[0], far - PREFILLS[0])]
    engine.step(shapes[-1])  # compile paths and touch memory before timing anything
    samples = []
    for works in shapes:
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            engine.step(works)
            best = min(best, time.perf_counter() - t0)
        samples.append((*step_features(works), best))
    return samples
