"""Sampling at a temperature on the device: what a step reads back of such a row.

A greedy row reads back one token id, its argmax taken on the device. A row
sampled at a temperature is not read back whole (the vocabulary's floats: 196 KB
for SmolLM2's 49,152) for the host to softmax, which would cost more host time a
token than a GPU's step: common.cl's `sample_hot` works on such a row where it
lies, in one work-group:

- without top-p, it draws the token itself: the step reads back only its id;
- with top-p, it finds the candidates (every token whose probability is within
  a factor CUT of the likeliest one's, at most CAP of them), with the row's
  largest logit and its softmax total; the host puts the nucleus together from
  them as gpu.sampling does over a whole row, and draws. Where they are too many
  or fall short of top_p (a flat distribution, a high temperature), the row is
  read back whole and sampled as before.

The draw `u` is the host's (gpu.sampling.uniform, keyed by the turn's seed and
the position), and a candidate's probability is the host's float64 exp of the
same logit, over the device's float32 softmax total. So a token can differ from
what the whole row gives on the host only where the draw, or the nucleus's
edge, falls within float32 rounding of a boundary between two tokens (about
1e-6 of the row's mass).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pyopencl as cl

from gpu.sampling import pick_from, sample, uniform
from runtime.scheduling.work import Sampling

CAP = 1024  # candidates a top-p row reads back at most (8 KB, against the vocabulary's 4 bytes a token)
CUT = math.log(1e4)  # candidates are at least 1/10,000 as likely as the likeliest token
HEADER = 4  # found[h]: count, largest logit, softmax total, cap; then (id, logit) pairs
i32, f32 = np.int32, np.float32


def plan_rows(samplings: Sequence[Sampling], positions: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """For the sampled rows (in step order): which are at a temperature (`hot`,
    by index), and their kernel parameters as int32 words (1 / temperature, and
    the draw u, or -1 where top-p makes the host finish the row)."""
    hot = np.array([i for i, s in enumerate(samplings) if not s.greedy], dtype=i32)
    params = np.empty((len(hot), 2), f32)
    for k, i in enumerate(hot):
        s = samplings[i]
        params[k] = (1.0 / s.temperature, uniform(s.seed, positions[i]) if s.top_p >= 1.0 else -1.0)
    return hot, params.view(i32)


class SampleHot:
    """The launch: one work-group per row at a temperature (`enqueue(queue, rows)`)."""

    name, weight_bytes = "sample", 0

    def __init__(
        self,
        program: cl.Program,
        wg: int,
        logits: cl.Buffer,
        vocab: int,
        rows: cl.Buffer,
        params: cl.Buffer,
        ids: cl.Buffer,
        found: cl.Buffer,
    ):
        self.kernel = cl.Kernel(program, "sample_hot")
        self.kernel.set_args(logits, i32(vocab), rows, params, ids, found, i32(HEADER + 2 * CAP), i32(CAP), f32(CUT))
        self.wg = wg

    def enqueue(self, queue: cl.CommandQueue, rows: int) -> cl.Event:
        return cl.enqueue_nd_range_kernel(queue, self.kernel, (rows * self.wg,), (self.wg,))


def finish_top_p(found: np.ndarray, sampling: Sampling, position: int) -> int | None:
    """A top-p row's token from its candidates (`found`: the kernel's words for
    the row), as gpu.sampling's top-p draw over the whole row would pick it; None
    if the candidates do not hold the nucleus (then the whole row is needed)."""
    count, cap = int(found[0]), int(found[3])
    if count > cap or count == 0:
        return None
    top, total = found[1:3].view(f32).astype(np.float64)
    pairs = found[HEADER : HEADER + 2 * count].reshape(count, 2)
    order = np.argsort(pairs[:, 0], kind="stable")  # by id, so that equal probabilities keep id order
    ids = pairs[order, 0]
    logits = pairs[order, 1].view(f32).astype(np.float64)
    # (gpu.sampling.probabilities' arithmetic for these tokens, over the device's total)
    p = np.exp(logits / sampling.temperature - top / sampling.temperature) / total
    best = np.argsort(-p, kind="stable")
    cumulative = np.cumsum(p[best])
    if cumulative[-1] < sampling.top_p:
        return None
    n = int(np.searchsorted(cumulative, sampling.top_p)) + 1
    nucleus = best[: min(n, best.size)]
    return pick_from(ids[nucleus], p[nucleus], uniform(sampling.seed, position))


def read_back(
    queue: cl.CommandQueue,
    buffers,
    ids: np.ndarray,
    hot: np.ndarray,
    params: np.ndarray,
    samplings: Sequence[Sampling],
    positions: Sequence[int],
    vocab: int,
) -> int:
    """After a step's launches and its ids' read: read the top-p rows' candidates,
    finish the queue, and put those rows' tokens into `ids`. Returns how many
    rows had to be read back whole."""
    top_p = np.flatnonzero(params.view(f32)[:, 1] < 0) if len(hot) else []
    found = np.empty((len(top_p), HEADER + 2 * CAP), i32)
    for j, k in enumerate(top_p):
        cl.enqueue_copy(queue, found[j], buffers.found, src_offset=4 * int(k) * found.shape[1], is_blocking=False)
    queue.finish()
    whole = 0
    for j, k in enumerate(top_p):
        i = int(hot[k])
        token = finish_top_p(found[j], samplings[i], positions[i])
        if token is None:  # the candidates do not hold the nucleus: the whole row, as before
            row = np.empty(vocab, f32)
            cl.enqueue_copy(queue, row, buffers.logits, src_offset=4 * i * vocab, is_blocking=True)
            token = sample(row, samplings[i], positions[i])
            whole += 1
        ids[i] = token
    return whole
