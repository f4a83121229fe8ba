"""What reaches the GPU owner, taken in at a token boundary.

The owner's one handler only queues a request (`_request`); at the next boundary
`_drain` applies each to the scheduler: a turn request is checked again (anything
can be put in a mailbox) and submitted, a cancel ends a turn or all of an
agent's, a lent priority goes to the scheduler's one store of it. Nothing an
agent sends may stop the owner: a request that cannot be taken ends its own
turn, if it has one, and nothing else. Mixed into `runtime.owner.GPUOwner`.
"""

from __future__ import annotations

import collections
import logging
from typing import Callable

import anyio

from runtime.bus import EventBus
from runtime.channel import UpdateSender
from runtime.errors import UsageError
from runtime.events import Failed
from runtime.messages import (
    CancelAgent, CancelTurn, OwnerRequest, SetInherited, TurnChannel, TurnRequest, TurnUpdate, turn_request_problem,
)
from runtime.scheduler import Scheduler

log = logging.getLogger("runtime.owner")  # the owner's log: this is part of it

STOPPED = "swarm stopped"


class Intake:
    # The owner's state this part uses.
    bus: EventBus
    scheduler: Scheduler
    closing: bool
    _arrived: collections.deque[OwnerRequest]
    _wakeup: anyio.Event
    _replies: dict[int, UpdateSender[TurnUpdate]]
    _notice: Callable[[OwnerRequest], None]

    def _request(self, request: OwnerRequest) -> None:
        self._arrived.append(request)
        self._wakeup.set()
        self._notice(request)  # runtime.abandon: it may outrank the step in flight

    async def _wait_for_request(self) -> None:
        while not self._arrived:
            self._wakeup = anyio.Event()
            await self._wakeup.wait()

    def _drain(self) -> None:
        while self._arrived:
            self._apply(self._arrived.popleft())

    def _apply(self, request: OwnerRequest) -> None:
        """Take one request. Nothing an agent sends may stop the owner: a request
        that cannot be taken ends its own turn (if it has one) and nothing else."""
        try:
            self._take(request)
        except Exception as exc:
            log.exception("GPU owner: refused %r", request)
            self._refuse(request, f"{type(exc).__name__}: {exc}")

    def _refuse(self, request: object, reason: str) -> None:
        reply = getattr(request, "reply", None)
        if not isinstance(request, TurnRequest) or not isinstance(reply, TurnChannel) or reply.turn_id in self.scheduler.turns:
            return  # no turn of its own to end
        agent = request.agent if isinstance(request.agent, str) else repr(request.agent)
        priority = request.priority if isinstance(request.priority, int) else 0
        failed = Failed(t=self.bus.now(), step=self.scheduler.step, turn=reply.turn_id, agent=agent, priority=priority, tokens=0, reason=reason)
        self.bus.emit(failed)
        self._replies.pop(reply.turn_id, None)
        try:
            reply.send.send_nowait(failed)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        reply.send.close()

    def _take(self, request: OwnerRequest) -> None:
        now = self.bus.now()
        sched = self.scheduler
        if isinstance(request, TurnRequest):
            if not isinstance(request.reply, TurnChannel):
                raise UsageError(f"a TurnRequest needs a TurnChannel to reply on, got {request.reply!r}")
            problem = turn_request_problem(request)
            if problem:
                raise UsageError(problem)
            turn_id = request.reply.turn_id
            self._replies[turn_id] = request.reply.send
            # Arrival is when the agent asked, not this boundary: the wait a person
            # sees includes the rest of the step that was running.
            sched.submit(
                request.agent, request.priority, request.prompt, request.max_tokens, min(request.t, now),
                sampling=request.sampling, ignore_eos=request.ignore_eos, turn_id=turn_id, lifts=request.lifts,
                constraint=request.constraint, prior_output=request.prior_output,
            )
        elif isinstance(request, CancelTurn):
            sched.cancel(request.turn, now, STOPPED if self.closing else request.reason)
        elif isinstance(request, CancelAgent):
            for turn in [t for t in sched.turns.values() if t.agent == request.agent]:
                sched.cancel(turn.id, now, STOPPED if self.closing else request.reason)
        elif isinstance(request, SetInherited):
            sched.set_inherited(request.lift, request.priority, now)
        else:
            raise UsageError(f"the GPU owner takes {', '.join(t.__name__ for t in OwnerRequest.__args__)}, not {request!r}")
