"""What the GPU owner runs in its step thread: steps and KV moves, one at a
time, in the order they were planned, so every device call is ordered after
the ones before it.

A step planned while the one before ran (runtime.scheduler.advance) decodes
tokens nobody knew then: the step thread puts them in from what the step
before sampled, right before it starts the step, so the device waits for
nothing the event loop does. Mixed into `runtime.owner.GPUOwner`.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

from runtime.engine import DeadEnd, Engine
from runtime.turns import UNKNOWN, Plan

log = logging.getLogger("runtime.owner")  # the owner's log: this is part of it

# What a step hands back from the step thread: a token (or None) per work (None
# for all: it was abandoned, runtime.abandon), the turns it alone failed with
# why, and its time (None if it failed).
Ran = tuple[list[int | None] | None, dict[int, str], float | None]


class DeviceWork:
    # The owner's state this part uses; `_step_ended` and `_sampled` are the step
    # thread's own.
    engine: Engine
    step_seconds: collections.deque[float]
    gap_seconds: collections.deque[float]
    steps_run: int
    _step_ended: float | None
    _sampled: dict[int, int | None]

    def _execute(self, launch: tuple[Plan, bool, threading.Event | None]) -> Ran:
        """Runs in the step thread: the blocking device work of one step. Its
        decodes of a token the step before sampled (UNKNOWN when planned) get
        that token first; a decode whose token never came (its turn faulted) is
        left out. If the step fails, each turn's work runs alone, so an error is
        pinned on the turn that causes it and the others go on. (Running a work
        again is exact: it rewrites the same K/V at the same positions, and
        sampling depends only on the turn's seed and position.) A step whose
        flag is up is abandoned (runtime.abandon), and one planned on it is
        never started."""
        plan, chained, abandon = launch
        if abandon is not None and abandon.is_set():
            self._sampled = {}
            return None, {}, None
        works = runnable = plan.works
        if plan.advanced:
            sampled, missing = self._sampled, False
            for work in works:
                if work.tokens[-1] == UNKNOWN:
                    token = sampled.get(work.turn)
                    if token is None:
                        missing = True
                    else:
                        work.tokens[-1] = token
            if missing:
                runnable = [w for w in works if w.tokens[-1] != UNKNOWN]
        started = time.perf_counter()
        if chained and self._step_ended is not None:
            # The device idled this long between the two: what the host did not hide.
            self.gap_seconds.append(started - self._step_ended)
        faults: dict[int, str] = {}
        try:
            try:
                out = self.engine.step(runnable, abandon) if runnable else []
            except DeadEnd as end:  # (its other turns' tokens stand: only the dead ones fail)
                out, faults = end.tokens, dict(end.reasons)
            if out is None:
                self._sampled = {}
                return None, {}, None
        except Exception as exc:
            log.warning("engine step failed (%s: %s); running its turns one by one", type(exc).__name__, exc)
            out = []
            for work in runnable:
                try:
                    out += self.engine.step([work])
                except DeadEnd as end:
                    out += end.tokens
                    faults.update(end.reasons)
                except Exception as exc:
                    faults[work.turn] = f"engine error: {type(exc).__name__}: {exc}"
                    out.append(None)
            spent = None
        else:
            spent = time.perf_counter() - started
            self.step_seconds.append(spent)  # KV moves excluded: the law prices the step
        self._step_ended = time.perf_counter()
        self.steps_run += 1
        self._sampled = {w.turn: t for w, t in zip(runnable, out) if w.sample}
        if runnable is not works:
            got = dict(zip((w.turn for w in runnable), out))
            out = [got.get(w.turn) for w in works]
        return out, faults, spent

    def _move(self, plan: Plan) -> dict[int, str]:
        """Runs in the step thread, with no step in flight: the plan's KV moves, in the order decided.
        Returns the turns whose move failed, with why; their later moves are skipped."""
        failed: dict[int, str] = {}
        for move in plan.moves:
            if move.turn in failed:
                continue
            try:
                move.apply(self.engine)
            except Exception as exc:
                failed[move.turn] = f"{type(move).__name__} failed: {type(exc).__name__}: {exc}"
        return failed
