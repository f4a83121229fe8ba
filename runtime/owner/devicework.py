"""What the GPU owner runs in its step thread: steps and KV moves, one at a
time, in the order they were planned, so every device call is ordered after
the ones before it. It keeps the figures of the steps it ran.
"""

from __future__ import annotations

import collections
import logging
import operator
import time

from runtime.owner.drafter import DraftModel
from runtime.owner.flight import Ran, StepInFlight
from runtime.scheduling.turns import Plan
from runtime.scheduling.work import DeadEnd, Engine

log = logging.getLogger("runtime.owner.owner")  # the owner's log: this is part of it

STEP_HISTORY = 10_000
TURN = operator.attrgetter("turn")


class DeviceWork:
    def __init__(self, engine: Engine, drafter: DraftModel | None = None) -> None:
        self.engine = engine
        self.drafter = drafter  # writes a verify step's drafts, where a draft model makes them
        # Wall time of the latest engine steps (bounded: an owner runs for days),
        # and how many steps it has run in all.
        self.step_seconds: collections.deque[float] = collections.deque(maxlen=STEP_HISTORY)
        self.steps_run = 0
        # Host time from a step's end to the next step's start (the device idles),
        # for steps launched back to back.
        self.gap_seconds: collections.deque[float] = collections.deque(maxlen=STEP_HISTORY)
        self._step_ended: float | None = None

    def run_step(self, flight: StepInFlight) -> Ran:
        """Runs in the step thread: the blocking device work of one step, its
        decodes given the tokens the step before sampled (StepInFlight.hand_over).
        If the step fails, each turn's work runs alone, so an error is pinned on
        the turn that causes it and the others go on. (Running a work again is
        exact: it rewrites the same K/V at the same positions, and sampling
        depends only on the turn's seed and position.) A step whose flag is up
        is abandoned (runtime.owner.abandon), and one planned on it is never
        started; nor is one whose flag went up while its drafts were made."""
        if flight.abandoned:
            return None, {}, None
        works = flight.plan.works
        runnable = flight.hand_over()
        if self.drafter is not None:
            # (before the step, and not in its time: the law prices the target's step)
            runnable, flight.drafted = self.drafter.fill(runnable, flight.flag)
            if flight.abandoned:  # (the draft model gave up: its stand-ins would all be refused)
                return None, {}, None
        started = time.perf_counter()
        if flight.chained and self._step_ended is not None:
            # The device idled this long between the two: what the host did not hide.
            self.gap_seconds.append(started - self._step_ended)
        faults: dict[int, str] = {}
        try:
            try:
                out = self.engine.step(runnable, flight.flag) if runnable else []
            except DeadEnd as end:  # (its other turns' tokens stand: only the dead ones fail)
                out, faults = end.tokens, dict(end.reasons)
            if out is None:
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
        # Each work's token by turn, for the decodes planned on them (None where
        # it samples none; a list where it verifies drafts, and nothing is
        # planned on those: runtime.scheduling.inflight).
        flight.sampled = got = dict(zip(map(TURN, runnable), out, strict=False))
        flight.complete = len(runnable) == len(works) and not faults and spent is not None
        if len(runnable) != len(works):  # (a decode left out: its token never came)
            out = [got.get(w.turn) for w in works]
        return out, faults, spent

    def run_moves(self, plan: Plan) -> dict[int, str]:
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
