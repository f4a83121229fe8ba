"""Step shaping: while a turn above background priority is live, each step is
built for it, and background work rides along only where it is nearly free.

A slot is not what a person feels; the time to the first token and between
tokens is. On a device where a step's cost grows with the tokens in it (a CPU,
or prefill chunks on a GPU), a foreground decode sharing its step with seven
background decodes and a prefill chunk runs several times slower than alone.
So, while such a turn is live (running or waiting):

- its work comes first: decodes, then its prefill in chunks of up to
  `SchedulerConfig.prefill_chunk` tokens (every step pays the fixed cost once,
  so the fewer the chunks, the sooner the first token);
- background work joins only while the predicted step stays within
  `(1 + slack)` of the step without it: decodes first, longest-unserved first,
  then background prefill in chunks cut to what is left (so a long foreground
  turn slows a background prompt down but never starves it).

The step cost model (runtime.scheduling.cost) makes the call: where a batch costs about
what one turn does (a GPU in its memory-bound regime) every background decode
fits and runs at full speed; on a CPU they are thinned. With no such turn live
the batch is exactly the unshaped one.
"""

from __future__ import annotations

from runtime.scheduling.cost import StepCost, kv_reads
from runtime.scheduling.priority import BACKGROUND


class StepBudget:
    """The cost ceiling background work must fit under in a shaped step."""

    def __init__(self, cost: StepCost, slack: float) -> None:
        self.cost, self.slack = cost, slack
        self.tokens = self.kv = 0
        self.limit: float | None = None  # set by `close_base`

    def add(self, start: int, n: int) -> None:
        self.tokens += n
        self.kv += n * start + n * (n + 1) // 2  # (kv_reads, inlined: once a turn at every shaped step)

    def close_base(self) -> float:
        """The protected work is in: fix the ceiling at (1 + slack) times its cost."""
        self.limit = (1 + self.slack) * self.cost.predict(self.tokens, self.kv)
        return self.limit

    def fits(self, start: int, n: int) -> bool:
        assert self.limit is not None
        return self.cost.predict(self.tokens + n, self.kv + kv_reads(start, n)) <= self.limit

    def largest(self, start: int, most: int) -> int:
        """The most tokens (up to `most`) from position `start` that still fit; 0 if none."""
        if most == 1:  # (a decode: the bisection's one question, `fits` inlined)
            return 1 if self.cost.predict(self.tokens + 1, self.kv + start + 1) <= self.limit else 0  # type: ignore[operator]
        lo, hi = 0, most  # the cost grows with n, so bisect
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.fits(start, mid):
                lo = mid
            else:
                hi = mid - 1
        return lo


def protected_priority(top_unaged: int | None) -> int | None:
    """The priority the step is shaped for: the highest unaged priority among
    the live turns (runtime.scheduling.priority), if it is above background."""
    return top_unaged if top_unaged is not None and top_unaged > BACKGROUND else None
