"""What reaches the GPU owner, taken in at a token boundary.

The owner's one handler only queues a request (`put`); at the next boundary
`drain` applies each to the scheduler: a turn request, checked as it arrived
(anything can be put in a mailbox; it was built checked, runtime.agent), is submitted, a cancel ends a turn or all of an
agent's, a lent priority goes to the scheduler's one store of it. Nothing an
agent sends may stop the owner: a request that cannot be taken ends its own
turn, if it has one, and nothing else. A part the GPU owner owns.
"""

from __future__ import annotations

import collections
import logging

import anyio

from runtime.actors.channel import UpdateSender
from runtime.errors import UsageError
from runtime.events.bus import EventBus
from runtime.events.kinds import Failed
from runtime.owner.messages import (
    CancelAgent,
    CancelTurn,
    OwnerRequest,
    SetInherited,
    TurnChannel,
    TurnRequest,
    TurnUpdate,
    turn_request_problem,
)
from runtime.scheduling.scheduler import Scheduler

log = logging.getLogger("runtime.owner.owner")  # the owner's log: this is part of it

STOPPED = "swarm stopped"


class Intake:
    """The requests that arrived and wait for the next token boundary."""

    def __init__(self, scheduler: Scheduler, bus: EventBus, replies: dict[int, UpdateSender[TurnUpdate]]) -> None:
        self.scheduler = scheduler
        self.bus = bus
        self.replies = replies  # the owner's: turn id -> where its updates go (a turn taken in gets one)
        # Taken at the next boundary, each with why it cannot be taken (a turn
        # request is checked once, as it arrives: anything can be put in a mailbox).
        self._waiting: collections.deque[tuple[OwnerRequest, str | None]] = collections.deque()
        self._wakeup = anyio.Event()
        # Set when the swarm shuts down: the turns its stopping agents leave were
        # ended by the shutdown, and say so.
        self.closing = False

    def put(self, request: OwnerRequest) -> TurnRequest | None:
        """Queue a request for the next boundary; returns it if it is a turn
        request that can be taken (what may outrank the step in flight)."""
        problem = None
        if isinstance(request, TurnRequest):
            if not isinstance(request.reply, TurnChannel):
                problem = f"a TurnRequest needs a TurnChannel to reply on, got {request.reply!r}"
            else:
                problem = turn_request_problem(request)
        self._waiting.append((request, problem))
        self._wakeup.set()
        return request if isinstance(request, TurnRequest) and problem is None else None

    @property
    def waiting(self) -> int:
        """How many requests wait for the next boundary."""
        return len(self._waiting)

    def waiting_turns(self) -> list[TurnRequest]:
        """The turn requests waiting that can be taken."""
        return [r for r, problem in self._waiting if isinstance(r, TurnRequest) and problem is None]

    async def wait(self) -> None:
        """Until a request has arrived."""
        while not self._waiting:
            self._wakeup = anyio.Event()
            await self._wakeup.wait()

    def drain(self) -> None:
        """Take every request that has arrived into the scheduler."""
        while self._waiting:
            self._apply(*self._waiting.popleft())

    def hang_up(self) -> None:
        """The owner stops: a request never taken in has its turn's channel closed
        (read as TurnFailed "the GPU owner stopped"), not left hanging."""
        for request, _ in self._waiting:
            if isinstance(request, TurnRequest) and isinstance(request.reply, TurnChannel):
                request.reply.send.close()
        self._waiting.clear()

    def _apply(self, request: OwnerRequest, problem: str | None) -> None:
        """Take one request. Nothing an agent sends may stop the owner: a request
        that cannot be taken ends its own turn (if it has one) and nothing else."""
        try:
            if problem:
                raise UsageError(problem)
            self._take(request)
        except Exception as exc:
            log.exception("GPU owner: refused %r", request)
            self._refuse(request, f"{type(exc).__name__}: {exc}")

    def _refuse(self, request: object, reason: str) -> None:
        if (
            not isinstance(request, TurnRequest)
            or not isinstance(request.reply, TurnChannel)
            or request.reply.turn_id in self.scheduler.turns
        ):
            return  # no turn of its own to end
        reply = request.reply
        agent = request.agent if isinstance(request.agent, str) else repr(request.agent)
        priority = request.priority if isinstance(request.priority, int) else 0
        failed = Failed(
            t=self.bus.now(), step=self.scheduler.step, turn=reply.turn_id, agent=agent, priority=priority, tokens=0, reason=reason
        )
        self.bus.emit(failed)
        self.replies.pop(reply.turn_id, None)
        try:
            reply.send.send_nowait(failed)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        reply.send.close()

    def _take(self, request: OwnerRequest) -> None:
        now = self.bus.now()
        sched = self.scheduler
        if isinstance(request, TurnRequest):  # (checked as it arrived: put)
            turn_id = request.reply.turn_id
            self.replies[turn_id] = request.reply.send
            # Arrival is when the agent asked, not this boundary: the wait a person
            # sees includes the rest of the step that was running.
            sched.submit(
                request.agent,
                request.priority,
                request.prompt,
                request.max_tokens,
                min(request.t, now),
                sampling=request.sampling,
                ignore_eos=request.ignore_eos,
                turn_id=turn_id,
                lifts=request.lifts,
                constraint=request.constraint,
                prior_output=request.prior_output,
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
