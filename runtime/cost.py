"""What one engine step costs: a small linear law, fitted online.

    step_s = fixed_s + token_s * tokens + kv_s * kv_reads

`tokens` are all the tokens in the step (decodes and prefill chunks); `kv_reads`
are the KV positions attention reads, summed over those tokens (a token at
position p reads p + 1). Three coefficients say what kind of device this is:
on a GPU in its memory-bound regime `token_s` is tiny next to `fixed_s` (a batch
costs about what one turn does); on a CPU every token costs real time. The
scheduler's step shaping (runtime.shaping) asks this model, never the device type.

Each engine carries one (`Engine.cost`). The OpenCL engine seeds it with a quick
calibration at start-up and the GPU owner feeds it every step it measures; the
simulator's timing model owns an exact one. The fit is least squares on relative
error (a 10 ms step 1 ms off is as wrong as a 100 ms one 10 ms off) with every
coefficient kept non-negative, over the calibration samples plus a window of
recent steps, so a burst of identical steps cannot make the law forget what
batch size costs.

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

import collections
import itertools
import statistics
from typing import Iterable, Sequence

import numpy as np

from runtime.engine import Work

SHAPED_UP_TO = 32  # steps of at most this many tokens get a factor of their own


def kv_reads(start: int, n: int) -> int:
    """KV positions read by `n` tokens at positions start .. start + n - 1."""
    return n * start + n * (n + 1) // 2


def step_features(works: Sequence[Work]) -> tuple[int, int]:
    """(tokens, kv_reads) of one engine step."""
    return sum(len(w.tokens) for w in works), sum(kv_reads(w.start, len(w.tokens)) for w in works)


class StepCost:
    """Predicts step seconds; `observe` refits it from measured steps."""

    def __init__(self, fixed_s: float = 0.01, token_s: float = 0.0, kv_s: float = 0.0, *, learns: bool = True, window: int = 256, refit_every: int = 16) -> None:
        self.fixed_s, self.token_s, self.kv_s = float(fixed_s), float(token_s), float(kv_s)
        self.learns = learns  # False: an exact law (the simulator's), never refitted
        self.anchors: list[tuple[int, int, float]] = []  # calibration samples, kept for good
        self.recent: collections.deque[tuple[int, int, float]] = collections.deque(maxlen=window)
        self.observed = 0
        self.refit_every = refit_every
        self.shape: dict[int, float] = {}  # tokens -> measured / law, for small steps seen

    def law(self, tokens: int, kv: int = 0) -> float:
        return self.fixed_s + self.token_s * tokens + self.kv_s * kv

    def predict(self, tokens: int, kv: int = 0) -> float:
        # The factor scales the per-step and per-token part (the matmuls a tile
        # pads), not attention's reads, which no tile pads.
        return (self.fixed_s + self.token_s * tokens) * self.factor(tokens) + self.kv_s * kv

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

    def idle_turn(self, prompt: int, tokens: int, chunk: int = 512, overhead_s: float = 0.0) -> tuple[float, float, float]:
        """What a turn would feel like alone on the engine: (time to first token,
        inter-token latency, turn time), its prompt in chunks of `chunk` tokens,
        each step also paying `overhead_s` of the owner's own work."""
        ttft = sum(overhead_s + self.predict(min(chunk, prompt - s), kv_reads(s, min(chunk, prompt - s))) for s in range(0, prompt, chunk))
        decodes = [overhead_s + self.predict(1, prompt + i + 1) for i in range(max(tokens - 1, 0))]
        itl = sum(decodes) / len(decodes) if decodes else 0.0
        return ttft, itl, ttft + sum(decodes)

    # ------------------------------------------------------------- fitting

    def calibrate(self, samples: Iterable[tuple[int, int, float]]) -> None:
        """Seed the law from deliberately varied steps (tokens, kv_reads, seconds)."""
        self.anchors = [s for s in samples if s[2] > 0]
        self.recent.clear()
        self.refit()

    def observe(self, tokens: int, kv: int, seconds: float) -> None:
        """One measured step. The law is refitted every `refit_every` steps."""
        if not self.learns or seconds <= 0 or tokens <= 0:
            return
        self.recent.append((tokens, kv, seconds))
        self.observed += 1
        if self.observed % self.refit_every == 0:
            self.refit()

    def refit(self) -> None:
        # Anchors weigh as much as a quarter of a full window, whatever their number.
        rows = [(s, 1.0) for s in self.recent]
        if self.anchors:
            w = max(1.0, 0.25 * (self.recent.maxlen or 1) / len(self.anchors))
            rows += [(s, w) for s in self.anchors]
        fitted = fit([s for s, _ in rows], [w for _, w in rows])
        if fitted is not None:
            self.fixed_s, self.token_s, self.kv_s = fitted
            self.shape = shape_factors([*self.anchors, *self.recent], self.fixed_s, self.token_s, self.kv_s)

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


def shape_factors(samples: Iterable[tuple[int, int, float]], fixed_s: float, token_s: float, kv_s: float) -> dict[int, float]:
    """For each small step size measured, the median over its steps of what the
    matmul part measured (the step less the law's attention) over what the law says."""
    ratios: dict[int, list[float]] = collections.defaultdict(list)
    for tokens, kv, seconds in samples:
        predicted = fixed_s + token_s * tokens
        if tokens <= SHAPED_UP_TO and predicted > 0:
            ratios[tokens].append(max(seconds - kv_s * kv, 0.0) / predicted)
    # (statistics.median: the same middle as np.median, without its overhead on short lists)
    return {n: float(statistics.median(r)) for n, r in sorted(ratios.items())}


def fit(samples: Sequence[tuple[int, int, float]], weights: Sequence[float] | None = None) -> tuple[float, float, float] | None:
    """Non-negative least squares on relative error, by trying every subset of the
    three coefficients (there are only seven) and keeping the best admissible one."""
    if not samples:
        return None
    data = np.asarray(samples, dtype=float)
    y = data[:, 2]
    x = np.column_stack([np.ones(len(data)), data[:, 0], data[:, 1]])
    w = (np.ones(len(data)) if weights is None else np.asarray(weights, dtype=float)) / y
    xw, yw = x * w[:, None], y * w
    best, best_err = None, np.inf
    for k in (3, 2, 1):
        for cols in itertools.combinations(range(3), k):
            sub = xw[:, cols]
            # (lstsq's rank is matrix_rank's, same tolerance: one SVD, not two)
            coef, _, rank, _ = np.linalg.lstsq(sub, yw, rcond=None)
            if rank < k or (coef < 0).any():
                continue
            err = float(np.sum((sub @ coef - yw) ** 2))
            if err < best_err - 1e-15:
                full = np.zeros(3)
                full[list(cols)] = coef
                best, best_err = full, err
        if k == 3 and best is not None:
            # The unconstrained optimum is admissible: a subset (its coefficients
            # held at zero) cannot fit better, and the six fits would be wasted.
            break
    return None if best is None else (float(best[0]), float(best[1]), float(best[2]))
