"""Each constrained turn's place in its constraint, and the token masks a step applies.

The engine keeps one llguidance matcher per constrained turn, by turn id. A
matcher only ever consumes the tokens a step is given as input (a decode's
token, a prefill's), never one it samples: so a step that is abandoned, or whose
token is thrown away, cannot move it past what the turn really holds. Before
each mask, `_reach` brings the matcher to exactly the turn's tokens before the
sampled position:

- the new ones (normally the one token a decode carries) are consumed; a
  recomputed turn's prefill brings none it has not seen;
- tokens it consumed that the turn no longer has (a step taken back) are rolled back;
- a turn it has never seen (moved from another owner) or has lost (`forget`)
  is replayed from the tokens the turn has (runtime.scheduling.constraints.TurnConstraint.tokens).

So the grammar state belongs to the turn, whatever happened to its KV.

A mask is one bit per token of the logits' row (llguidance's layout, int32
words, bit j % 32 of word j // 32), applied on the device before argmax and the
sampler (kernels/common.cl's apply_mask). A mask with no bit set is a dead end:
the turn fails with why (runtime.scheduling.work.DeadEnd). Where the grammar may end, the
mask allows every end-of-sequence token of the model, so a turn whose grammar
is complete ends as a free one would (stop).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import llguidance
import numpy as np

from gpu.grammar import ConstraintCompiler, describe, short_error
from runtime.errors import UsageError
from runtime.scheduling.constraints import Constraint
from runtime.scheduling.work import Work

i32 = np.int32


@dataclass
class _Place:
    constraint: Constraint
    matcher: llguidance.LLMatcher
    consumed: list[int] = field(default_factory=list)  # from the constraint's start position


class TurnMasks:
    """The matchers of the engine's constrained turns. `fill`, `begin_step` and
    `end_step` run in one thread at a time (the engine's step thread); `forget`
    may come from any thread."""

    def __init__(self, compiler: ConstraintCompiler) -> None:
        self.compiler = compiler
        self.words = (compiler.vocab_size + 31) // 32
        self._places: dict[int, _Place] = {}
        self._lock = threading.Lock()
        # Turns forgotten, with the count of steps begun then: a step planned
        # before the forget (the one running, or the one after it) may still
        # hold a turn's work and bring its place back, in any of the fills it
        # makes, so the place is dropped again at the end of each fill, until a
        # step that began after the forget has ended (`begin_step`, `end_step`).
        self._forgotten: dict[int, int] = {}
        self._steps_begun = 0
        self._end_only = np.zeros(self.words, i32)  # allows every end-of-sequence token, nothing else
        for eos in compiler.eos_ids:
            self._end_only[eos // 32] |= i32(np.uint32(1 << (eos % 32)).view(i32))
        self.replayed = 0  # tokens consumed to find a lost place again (tests, bench)

    def __len__(self) -> int:
        return len(self._places)

    def fill(self, works: Sequence[Work], out: np.ndarray) -> dict[int, str]:
        """Each work's mask (constrained, sampling works, in order) into out's rows;
        returns the turns at a dead end, with why."""
        dead: dict[int, str] = {}
        try:
            for row, work in zip(out, works, strict=False):
                try:
                    why = self._fill(work, row)
                except UsageError as exc:  # (a request sent past the agents' check: only its turn fails)
                    why = str(exc)
                if why is not None:
                    dead[work.turn] = why
        finally:
            self._drop_forgotten()
        return dead

    def begin_step(self) -> int:
        """A step begins (the engine calls this, and `end_step` with what it
        returns once the step has ended, however it ended)."""
        with self._lock:
            self._steps_begun += 1
            return self._steps_begun

    def end_step(self, step: int) -> None:
        """Step `step` has ended: a turn forgotten before it began has no work in
        any step to come."""
        self._drop_forgotten(before=step)

    def _drop_forgotten(self, *, before: int = 0) -> None:
        with self._lock:
            for turn in self._forgotten:
                self._places.pop(turn, None)
            for turn in [t for t, begun in self._forgotten.items() if begun < before]:
                del self._forgotten[turn]

    def forget(self, turn: int) -> None:
        """The turn ended (or lost its place): drop its matcher, now and again at
        the end of every fill until a step begun after this one has ended (the
        step in flight when a turn ends may still hold its work, planned before
        it ended)."""
        with self._lock:
            self._places.pop(turn, None)
            self._forgotten[turn] = self._steps_begun  # (even with no place yet: the step in flight may be its first)

    def _fill(self, work: Work, row: np.ndarray) -> str | None:
        place = self._reach(work)
        matcher = place.matcher
        if matcher.is_error():
            self._places.pop(work.turn, None)  # (no use keeping: the next try replays)
            return f"{describe(place.constraint)} cannot follow the turn's output so far ({short_error(matcher.get_error())})"
        if matcher.is_stopped():
            row[:] = self._end_only
            return None
        matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        if not matcher.is_error() and (row & self._end_only).any():  # the grammar may end here: any of the model's ends will do
            row |= self._end_only
        if matcher.is_error() or not row.any():
            why = f": {short_error(matcher.get_error())}" if matcher.is_error() else ""
            self._places.pop(work.turn, None)
            return f"dead end: {describe(place.constraint)} allows no token after {len(place.consumed)} tokens of output{why}"
        return None

    def _reach(self, work: Work) -> _Place:
        """The turn's matcher, having consumed exactly its tokens before the position
        `work` samples at."""
        c = work.constraint
        place = self._places.get(work.turn)
        if place is None or place.constraint != c.constraint:
            place = self._places[work.turn] = _Place(c.constraint, self.compiler.matcher(c.constraint))
        end = work.start + len(work.tokens)
        target = max(0, end - c.start)
        first = max(work.start, c.start)  # the work's first constrained position
        # How much of what it consumed the turn still has: all, unless the work's
        # tokens say otherwise (or the turn is shorter now).
        keep = min(len(place.consumed), target)
        overlap = min(end, c.start + keep)
        if first < overlap:
            mine = place.consumed[first - c.start : overlap - c.start]
            theirs = work.tokens[first - work.start : overlap - work.start]
            if mine != theirs:
                keep = first - c.start + next(i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b)
        if keep < len(place.consumed):
            back = len(place.consumed) - keep
            if place.matcher.rollback(back):
                del place.consumed[keep:]
            else:  # (beyond what it can undo: start again)
                place = self._places[work.turn] = _Place(c.constraint, self.compiler.matcher(c.constraint))
                keep = 0
        at = c.start + keep  # the next position to consume
        if at >= target + c.start:
            return place
        new = c.tokens(at, first) if at < first else []
        self.replayed += len(new)
        new += work.tokens[max(at, first) - work.start :]
        if new:
            place.matcher.consume_tokens(new)  # (a token it does not allow puts it in its error state: _fill says so)
            place.consumed += new
        return place


class MaskTimes:
    """What the masks cost: host seconds computing them (wall, and the thread's
    own CPU time: on a busy host the wall time includes waiting for a core), and
    of those, the seconds the device ran out of queued work before they were done
    (not hidden)."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.rows = self.steps = 0
        self.compute_s = self.cpu_s = self.exposed_s = 0.0

    def note(self, rows: int, compute_s: float, cpu_s: float, exposed_s: float, *, first: bool) -> None:
        """One fill of a step's masks (`first`: the step's first)."""
        self.rows += rows
        self.compute_s += compute_s
        self.cpu_s += cpu_s
        self.exposed_s += exposed_s
        self.steps += first
