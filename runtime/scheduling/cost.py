"""What one engine step costs: a small linear law, fitted online.

    step_s = fixed_s + token_s * tokens + kv_s * kv_reads

`tokens` are all the tokens in the step (decodes and prefill chunks); `kv_reads`
are the KV positions attention reads, summed over those tokens (a token at
position p reads p + 1). Three coefficients say what kind of device this is:
on a GPU in its memory-bound regime `token_s` is tiny next to `fixed_s` (a batch
costs about what one turn does); on a CPU every token costs real time. The
scheduler's step shaping (runtime.scheduling.shaping) asks this model, never the device type.

Each engine carries one (`Engine.cost`). The OpenCL engine seeds it with a quick
calibration at start-up and the GPU owner feeds it every step it measures; the
simulator's timing model owns an exact one. The fit is least squares on relative
error (a 10 ms step 1 ms off is as wrong as a 100 ms one 10 ms off) with every
coefficient kept non-negative, over the calibration samples plus a window of
recent steps, so a burst of identical steps cannot make the law forget what
batch size costs. A refit costs about 0.1 ms of host time, so it waits for 16
steps and for 20 ms of measured device time since the last one: on a fast
device the law still follows what it measures, at under 1% of its time.

A straight line cannot follow a device that pads a batch to a kernel's tile (on
the CPU family one decode runs a matrix-vector kernel and two run a 2-column
tile, which costs far more than the line's per-token slope says). So small steps
also get a learned factor per size on the law's per-step and per-token part (the
matmuls a tile pads; attention's reads are not padded): the median, over the
steps of that many tokens, of what that part measured over what the line says. Shaping asks exactly that question (does one
more background decode fit beside the foreground one?), and a 20% error there
is a 20% slower foreground token.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

import numpy as np

from runtime.scheduling.work import Work

SHAPED_UP_TO = 32  # steps of at most this many tokens get a factor of their own


def kv_reads(start: int, n: int) -> int:
    """KV positions read by `n` tokens at positions start .. start + n - 1."""
    return n * start + n * (n + 1) // 2


def step_features(works: Sequence[Work]) -> tuple[int, int]:
    """(tokens, kv_reads) of one engine step."""
    tokens = kv = 0
    for work in works:  # (kv_reads, inlined: this runs at every step)
        n = len(work.tokens)
        tokens += n
        kv += n * work.start + n * (n + 1) // 2
    return tokens, kv


class StepCost:
    """Predicts step seconds; `observe` refits it from measured steps."""

    def __init__(
        self,
        fixed_s: float = 0.01,
        token_s: float = 0.0,
        kv_s: float = 0.0,
        *,
        learns: bool = True,
        window: int = 256,
        refit_every: int = 16,
        refit_seconds: float = 0.02,
    ) -> None:
        self.fixed_s, self.token_s, self.kv_s = float(fixed_s), float(token_s), float(kv_s)
        self.learns = learns  # False: an exact law (the simulator's), never refitted
        self.anchors: list[tuple[int, int, float]] = []  # calibration samples, kept for good
        # The recent steps, rows of (tokens, kv_reads, seconds) in a ring: kept as
        # an array, not converted from tuples at each refit (a third of its cost).
        self._ring = np.empty((window, 3))
        self._held = 0  # rows of the ring in use
        self._next = 0  # the row the next step goes to: the oldest once it is full
        self._anchor_rows = np.empty((0, 3))
        self.observed = 0
        self.refit_every = refit_every
        self.refit_seconds = refit_seconds
        self._since_refit = (0, 0.0)  # steps and measured seconds since the last refit
        self.shape: dict[int, float] = {}  # tokens -> measured / law, for small steps seen

    def law(self, tokens: int, kv: int = 0) -> float:
        return self.fixed_s + self.token_s * tokens + self.kv_s * kv

    def predict(self, tokens: int, kv: int = 0) -> float:
        # The factor scales the per-step and per-token part (the matmuls a tile
        # pads), not attention's reads, which no tile pads. (Without a shape
        # learned it is 1: not asked, since every step's plan asks several times.)
        return (self.fixed_s + self.token_s * tokens) * (self.factor(tokens) if self.shape else 1.0) + self.kv_s * kv

    def factor(self, tokens: int) -> float:
        """The learned correction for a step of `tokens`: its own where measured,
        interpolated between measured sizes, 1 outside them."""
        if tokens in self.shape or not self.shape:
            return self.shape.get(tokens, 1.0)
        below = max((n for n in self.shape if n < tokens), default=None)
        above = min((n for n in self.shape if n > tokens), default=None)
        if below is None or above is None:
            return 1.0
        w = (tokens - below) / (above - below)
        return (1 - w) * self.shape[below] + w * self.shape[above]

    def predict_works(self, works: Sequence[Work]) -> float:
        return self.predict(*step_features(works))

    def idle_turn(self, prompt: int, tokens: int, chunk: int = 512, overhead_s: float = 0.0, cached: int = 0) -> tuple[float, float, float]:
        """What a turn would feel like alone on the engine: (time to first token,
        inter-token latency, turn time), its prompt past the `cached` positions
        the prefix cache gave it (at least its last one is computed) in chunks
        of `chunk` tokens, each step also paying `overhead_s` of the owner's own
        work."""
        first = max(0, min(cached, prompt - 1))
        ttft = sum(
            overhead_s + self.predict(min(chunk, prompt - s), kv_reads(s, min(chunk, prompt - s))) for s in range(first, prompt, chunk)
        )
        decodes = [overhead_s + self.predict(1, prompt + i + 1) for i in range(max(tokens - 1, 0))]
        itl = sum(decodes) / len(decodes) if decodes else 0.0
        return ttft, itl, ttft + sum(decodes)

    # ------------------------------------------------------------- fitting

    def calibrate(self, samples: Iterable[tuple[int, int, float]]) -> None:
        """Seed the law from deliberately varied steps (tokens, kv_reads, seconds)."""
        self.anchors = [s for s in samples if s[2] > 0]
        self._anchor_rows = np.asarray(self.anchors, dtype=float).reshape(-1, 3)
        self._held = self._next = 0
        self.refit()

    def observe(self, tokens: int, kv: int, seconds: float) -> None:
        """One measured step. The law is refitted every `refit_every` steps, once
        they add up to `refit_seconds`."""
        if not self.learns or seconds <= 0 or tokens <= 0:
            return
        ring = self._ring
        ring[self._next] = (tokens, kv, seconds)
        self._next = (self._next + 1) % len(ring)
        self._held = min(self._held + 1, len(ring))
        self.observed += 1
        steps, spent = self._since_refit
        steps, spent = steps + 1, spent + seconds
        self._since_refit = (steps, spent)
        if steps >= self.refit_every and spent >= self.refit_seconds:
            self.refit()

    def refit(self) -> None:
        # Anchors weigh as much as a quarter of a full window, whatever their number.
        recent = self._window()
        weights = np.ones(len(recent) + len(self._anchor_rows))
        if self.anchors:
            weights[len(recent) :] = max(1.0, 0.25 * len(self._ring) / len(self.anchors))
        data = np.concatenate((recent, self._anchor_rows))
        self._since_refit = (0, 0.0)
        fitted = fit_rows(data, weights)
        if fitted is not None:
            self.fixed_s, self.token_s, self.kv_s = fitted
            self.shape = shape_rows(data, self.fixed_s, self.token_s, self.kv_s)

    def _window(self) -> np.ndarray:
        """The recent steps' rows, oldest first."""
        if self._held < len(self._ring):
            return self._ring[: self._held]
        return np.concatenate((self._ring[self._next :], self._ring[: self._next]))

    @property
    def coefficients(self) -> dict[str, float]:
        return {"fixed_s": self.fixed_s, "token_s": self.token_s, "kv_s": self.kv_s}

    def describe(self) -> str:
        law = f"{self.fixed_s * 1e3:.2f} ms + {self.token_s * 1e3:.3f} ms/token + {self.kv_s * 1e9:.2f} ns/KV position read"
        if not self.shape:
            return law
        return law + "; steps of " + ", ".join(f"{n}: x{f:.2f}" for n, f in sorted(self.shape.items()))

    def __repr__(self) -> str:
        return f"<StepCost {self.describe()}>"


def shape_rows(rows: np.ndarray, fixed_s: float, token_s: float, kv_s: float) -> dict[int, float]:
    """For each small step size measured, the median over its steps of what the
    matmul part measured (the step less the law's attention) over what the law
    says. `rows` are (tokens, kv_reads, seconds)."""
    tokens = rows[:, 0]
    predicted = fixed_s + token_s * tokens
    small = (tokens <= SHAPED_UP_TO) & (predicted > 0)
    if not small.any():
        return {}
    sizes = tokens[small]
    ratios = np.maximum(rows[small, 2] - kv_s * rows[small, 1], 0.0) / predicted[small]
    order = np.lexsort((ratios, sizes))  # by size, then ratio: each size's ratios sorted
    sizes, ratios = sizes[order], ratios[order]
    values, starts, counts = np.unique(sizes, return_index=True, return_counts=True)
    # The middle one, or the mean of the middle two (what statistics.median returns).
    low, high = ratios[starts + (counts - 1) // 2], ratios[starts + counts // 2]
    medians = (low + high) / 2
    return {int(n): float(m) for n, m in zip(values, medians, strict=False)}


def fit(samples: Sequence[tuple[int, int, float]], weights: Sequence[float] | None = None) -> tuple[float, float, float] | None:
    """Non-negative least squares on relative error, by trying every subset of the
    three coefficients (there are only seven) and keeping the best admissible one."""
    if not samples:
        return None
    data = np.asarray(samples, dtype=float)
    return fit_rows(data, np.ones(len(data)) if weights is None else np.asarray(weights, dtype=float))


def fit_rows(data: np.ndarray, weights: np.ndarray) -> tuple[float, float, float] | None:
    """`fit` of rows (tokens, kv_reads, seconds) with a weight each."""
    if not len(data):
        return None
    y = data[:, 2]
    x = np.column_stack([np.ones(len(data)), data[:, 0], data[:, 1]])
    w = weights / y
    xw, yw = x * w[:, None], y * w
    best, best_err = None, np.inf
    admissible: list[tuple[int, ...]] = []
    for k in (3, 2, 1):
        for cols in itertools.combinations(range(3), k):
            if any(set(cols) < set(fitted) for fitted in admissible):
                # Its fit is an admissible one's with a coefficient held at zero,
                # which fits no better: not tried (the best cannot change).
                continue
            sub = xw[:, cols]
            # (lstsq's rank is matrix_rank's, same tolerance: one SVD, not two)
            coef, _, rank, _ = np.linalg.lstsq(sub, yw, rcond=None)
            if rank < k or (coef < 0).any():
                continue
            admissible.append(cols)
            err = float(np.sum((sub @ coef - yw) ** 2))
            if err < best_err - 1e-15:
                full = np.zeros(3)
                full[list(cols)] = coef
                best, best_err = full, err
    return None if best is None else (float(best[0]), float(best[1]), float(best[2]))
