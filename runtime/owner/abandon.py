"""Abandoning a step: a turn that outranks all of the step in flight does not wait it out.

A step is the token boundary's granularity, and on a CPU (or with a long prefill
chunk on any device) a step of background work can last many times the
foreground's own steps. A foreground turn that arrives just after one started
would wait out all of it before it even had a slot: the wait a person feels is
the rest of the step in flight. So the owner hands each step the engine runs an
`abandon` flag (runtime.scheduling.work.Engine.step), and sets it when a turn request
arrives whose priority is above every turn in the step: the engine stops at its
next check point, the step counts for nothing (nobody's tokens move, the K/V it
wrote is written again), and the next boundary admits the new turn, pausing a
lower one as usual. What is lost is the part of one background step already
run; the engine's check points bound the wait to a fraction of a step. A step
predicted to be short (`worth_abandoning`) is not armed at all.

The simulator (swarm.sim) prices the same rule: `worth_abandoning`, and
`stopped_after` for when a raised flag stops a step.

Only the preempting policies abandon steps (under the others, an arrival waits
for a slot anyway), and a lent priority (SetInherited) does not: it lifts a turn
already queued, which the next boundary admits. `StepAbandon` is the owner's
part that keeps the flag: the owner arms it at launch and tells it of every
request as it arrives (`notice`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable

from runtime.events.bus import EventBus
from runtime.events.kinds import StepAbandoned
from runtime.owner.messages import TurnRequest
from runtime.scheduling.cost import StepCost
from runtime.scheduling.scheduler import Scheduler
from runtime.scheduling.turns import Plan
from runtime.scheduling.work import CHECK_POINTS


def worth_abandoning(plan: Plan, cost: StepCost, slack: float) -> bool:
    """Whether a turn that arrives during this step would wait notably longer than
    one of its own steps: the step is predicted to last over (1 + slack) times a
    lone decode at its turns' mean context (what step shaping lets a protected
    step grow to). On a GPU a batch of decodes costs about one, so only long
    prefill chunks are worth it; on a CPU most background steps are. Below
    that, the check points cost more than stopping early could save."""
    tokens, kv = plan.features
    return cost.predict(tokens, kv) > (1 + slack) * cost.predict(1, kv // max(len(plan.works), 1))


def abandon_bar(plan: Plan, scheduler: Scheduler) -> int | None:
    """The priority a turn arriving during this plan's step must beat to have
    it abandoned (None: it runs to its end). The owner arms each step by it,
    and the simulator prices the same rule."""
    config = scheduler.config
    if not (config.abandon_steps and scheduler.policy.preempts) or not worth_abandoning(plan, scheduler.cost, config.slack):
        return None
    return scheduler.priorities.top_unaged(plan.turns)


def stopped_after(raised: float, step_s: float) -> float | None:
    """When a step of `step_s` seconds stops if its flag is raised `raised`
    seconds in, at the engine's check points (None: it runs to its end first).
    What the simulator prices an abandoned step at."""
    group = step_s / CHECK_POINTS
    stop = group * (math.floor(max(raised, 0.0) / group) + 2)
    return stop if stop < step_s else None


class StepAbandon:
    """The abandon flag the owner hands the engine with each step, and who may raise it."""

    def __init__(self, scheduler: Scheduler, bus: EventBus) -> None:
        self.scheduler = scheduler
        self.bus = bus
        self.flag = threading.Event()
        # The priority an arriving turn must beat to abandon the step in flight
        # (None: it may not be abandoned), and the first that did.
        self._bar: int | None = None
        self._by: TurnRequest | None = None
        self.steps_abandoned = 0

    @property
    def raised(self) -> bool:
        return self.flag.is_set()

    def arm(self, plan: Plan, waiting: Iterable[TurnRequest], ahead: Plan | None = None) -> threading.Event | None:
        """The flag to hand the engine with this plan's step (None: it runs to the
        end); raised at once if a request that outranks it came in while it was
        planned (`waiting`: not yet taken in). A step planned while `ahead` runs
        shares its flag if it has one: a step planned on a step abandoned is
        abandoned too, so the flag is not lowered, and a turn must outrank both."""
        ahead_bar = self._bar if ahead is not None else None
        if ahead is None:
            self.flag.clear()
            self._by = None
        if ahead_bar is None:
            self._bar = abandon_bar(plan, self.scheduler)
            if self._bar is None:
                return None
        else:
            bar = self.scheduler.priorities.top_unaged(plan.turns)
            self._bar = ahead_bar if bar is None else max(bar, ahead_bar)
        for request in waiting:
            self.notice(request)
        return self.flag

    def disarm(self, still: Plan | None = None) -> None:
        """A step was taken in: the flag now guards `still`, the step in flight, alone."""
        if still is None or self._bar is None:
            self._bar = None
        else:
            self._bar = self.scheduler.priorities.top_unaged(still.turns)

    def notice(self, request: TurnRequest) -> None:
        """A turn request (checked: runtime.owner.intake) came in while a step runs:
        abandon the step if the request's turn outranks it."""
        bar = self._bar
        if bar is None or self.flag.is_set():
            return
        if self.scheduler.priorities.unaged_of(request.priority, (request.agent, *request.lifts)) > bar:
            self._by = request
            self.flag.set()

    def abandoned(self, plan: Plan) -> None:
        """The step stopped early: say so; nothing else changes."""
        self.steps_abandoned += 1
        by = self._by
        self.bus.emit(
            StepAbandoned(
                t=self.bus.now(),
                step=self.scheduler.step,
                turns=len(plan.works),
                tokens=sum(len(w.tokens) for w in plan.works),
                by_agent=by.agent if by is not None else None,
                by_priority=by.priority if by is not None else None,
            )
        )
