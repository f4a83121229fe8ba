"""The GPU owner: the one actor that drives the engine, a token at a time.

What reaches it comes through its mailbox (agents use runtime.client.GPUClient):
turn requests and cancels, and from the actor system, agents that stopped and
priorities lent. Its handler only queues them; its loop, once per token boundary:

    take what has arrived into the scheduler       (submit, cancel, inherit)
    plan = scheduler.schedule(now)                  (admit, preempt, resume)
    scheduler.advance(plan); hand it to the step thread
    take in the step that was running: scheduler.postprocess(...)   (finish, count)
    while the new one runs: deliver that step's tokens, then the decisions,
                   each on its turn's own channel

Step N+1 is planned and launched while step N runs, as vLLM's async scheduling
and SGLang's overlap scheduler do: the plan assumes every running decode yields
a token (runtime.scheduler.advance), and the step thread, right after step N,
puts N's tokens into N+1's decodes and starts it, before this loop has even
heard that N ended. So the device waits for no host work but that hand-over;
a turn that ended at N on end-of-sequence has its N+1 work thrown away. A step
with KV moves is the exception: the step in flight is taken in first, the moves
run, then the step. Requests are only ever applied at a boundary, and every
device call (steps, moves) runs in the one step thread in the order planned,
so blocks a cancelled or finished turn frees are reused only by steps that run
after any step still using them (taking requests in is runtime.intake).
"""

from __future__ import annotations

import collections
import logging
import math

import anyio
import msgspec

from runtime.abandon import StepAbandon
from runtime.actors import Actor, handler
from runtime.blocks import BlockPool
from runtime.devicework import DeviceWork, Ran
from runtime.engine import Engine
from runtime.bus import EventBus
from runtime.channel import UpdateSender
from runtime.events import Ended, Event, SwappedIn, SwappedOut, TurnEvent
from runtime.intake import STOPPED, Intake
from runtime.messages import CancelAgent, CancelTurn, OwnerRequest, SetInherited, Token, TurnChannel, TurnRequest, TurnUpdate
from runtime.priority import FOREGROUND
from runtime.scheduler import Scheduler
from runtime.serving import lift_key
from runtime.stepthread import Job, StepThread
from runtime.turns import Plan, SchedulerConfig, Turn

log = logging.getLogger(__name__)

STEP_HISTORY = 10_000


class GPUOwner(Intake, StepAbandon, DeviceWork, Actor):
    mailbox_size = math.inf  # a request is never refused for room: the handler only queues it

    def __init__(self, engine: Engine, config: SchedulerConfig, bus: EventBus, *, name: str = "gpu") -> None:
        super().__init__(name, FOREGROUND)
        self.engine = engine
        self.bus = bus
        self._decided: list[Event] = []
        self.scheduler = Scheduler(
            config, BlockPool(engine.num_blocks, engine.block_size, namespace=engine.model_id), eos_token_ids=engine.eos_token_ids,
            vocab_size=engine.vocab_size, emit=self._decided.append, cost=engine.cost,
        )
        self._arrived: collections.deque[OwnerRequest] = collections.deque()  # taken at the next boundary
        self._wakeup = anyio.Event()
        self._replies: dict[int, UpdateSender[TurnUpdate]] = {}
        # Set when the swarm shuts down: the turns its stopping agents leave were
        # ended by the shutdown, and say so.
        self.closing = False
        # Wall time of the latest engine steps (bounded: an owner runs for days),
        # and how many steps it has run in all.
        self.step_seconds: collections.deque[float] = collections.deque(maxlen=STEP_HISTORY)
        self.steps_run = 0
        # Host time from a step's end to the next step's start (the device idles),
        # measured in the step thread for steps launched back to back.
        self.gap_seconds: collections.deque[float] = collections.deque(maxlen=STEP_HISTORY)
        self.overhead_seconds = self.gap_seconds  # the owner's host time per step that the step did not hide
        # The last step's tokens, not yet delivered, and when they were sampled (made
        # into Token messages as they are sent, while the next step runs).
        self._pending: list[tuple[Turn, int]] = []
        self._pending_t = 0.0
        self._measured: tuple[int, int, float] | None = None  # the last step's (tokens, kv reads, seconds), not yet learned
        # The step launched and not yet taken in (its plan advanced: runtime.scheduler).
        self._flight: tuple[Plan, Job[Ran]] | None = None
        self._chained = False  # whether the next step follows one at once (else the device was idle)
        # Step thread only: when the last step ended, and what it sampled, by turn.
        self._step_ended: float | None = None
        self._sampled: dict[int, int | None] = {}
        self._init_abandon()

    # ---------------------------------------------------------------- hooks

    async def on_start(self) -> None:
        # Before any turn: the step shaping needs to know what a step costs here.
        await anyio.to_thread.run_sync(self.engine.calibrate)
        self.system.step_source = lambda: self.scheduler.step
        self.system.on_actor_stopped.append(self._actor_stopped)
        self.system.on_lift.append(self._lifted)

    def _actor_stopped(self, name: str) -> None:
        if name != self.name:
            self._request(CancelAgent(agent=name, reason=f"agent {name} stopped"))

    def _lifted(self, agent: str, via: str, priority: int | None) -> None:
        # Only the turns serving the request are lifted, not all of the agent's.
        self._request(SetInherited(lift=lift_key(agent, via), priority=priority))

    @handler
    async def arrive(self, request: TurnRequest | CancelTurn | CancelAgent | SetInherited) -> None:
        """Every request waits for the next token boundary: none is applied while
        a step runs, so a cancelled turn's blocks are freed when no step uses them."""
        self._request(request)

    def on_undelivered(self, msg: msgspec.Struct) -> bool:
        # A request still in the mailbox at shutdown is taken by on_stop like the
        # rest, so its turn ends in a terminal event instead of hanging its agent.
        self._request(msg)  # type: ignore[arg-type]
        return True

    async def on_stop(self) -> None:
        # Every turn ends in exactly one terminal event, even at shutdown.
        try:
            self._deliver()
            self._drain()
            now = self.bus.now()
            for turn_id in list(self.scheduler.turns):
                self.scheduler.cancel(turn_id, now, STOPPED)
            self._publish()
        finally:
            # Even if the owner died of a bug and the above failed too: no agent is
            # left waiting on a turn (a channel closed without an end reads as
            # TurnFailed "the GPU owner stopped").
            for request in self._arrived:
                if isinstance(request, TurnRequest) and isinstance(request.reply, TurnChannel):
                    request.reply.send.close()
            self._arrived.clear()
            for reply in self._replies.values():
                reply.close()
            self._replies.clear()

    # ----------------------------------------------------------------- loop

    async def run(self) -> None:
        with StepThread(f"{self.name}-step", inline=not self.engine.blocking) as device:
            try:
                while True:
                    await self._boundary(device)
            finally:
                # Never leave a step running unowned: it is taken in (its tokens
                # delivered) before the step thread is left.
                with anyio.CancelScope(shield=True):
                    try:
                        await self._land()
                    except Exception:
                        log.exception("GPU owner: the step in flight could not be taken in")

    async def _boundary(self, device: StepThread) -> None:
        """One token boundary: plan the next step and launch it, then take in the
        step that was running and deliver its tokens while the new one runs."""
        if not self.scheduler.turns and self._flight is None:
            self._pass_on()
            self._chained = False
            await self._wait_for_request()  # idle: sleep until asked
        if self._flight is not None and self._abandon.is_set():
            # It is being abandoned (runtime.abandon): planned after it is taken
            # in, this boundary plans on what counts.
            await self._land(deliver=False)
        self._drain()
        plan = self.scheduler.schedule(self.bus.now())
        if plan.moves:
            # A move touches blocks the step in flight may use, and one that fails
            # changes this plan (and is not to be reported as made): the step in
            # flight is taken in first, then the moves run, then this step. It is
            # no longer abandoned then: this plan counts on it.
            self._disarm()
            await self._land(deliver=False)
            self._settle(plan, await device.submit(self._move, plan).result())
        if not plan.works:
            # (Every running turn may be owed its last token by the step in flight:
            # once that is taken in, the next boundary has slots to give.)
            idle = self._flight is None
            await self._land()
            self._chained = False
            if idle and self.scheduler.turns:
                # Nothing could run this boundary (memory was being freed):
                # look again soon, or as soon as something changes.
                with anyio.move_on_after(0.05):
                    await self._wait_for_request()
            return
        # Launched before the step in flight has even ended: the step thread puts
        # that step's tokens into this one's decodes and starts it at once, so
        # the device does not wait for this loop (runtime.scheduler.advance).
        self.scheduler.advance(plan)
        ahead = self._flight[0] if self._flight is not None else None
        job = device.submit(self._execute, (plan, self._chained, self._arm(plan, list(self._arrived), ahead)))
        self._chained = True
        flight, self._flight = self._flight, (plan, job)
        if flight is not None:
            await self._take_in(*flight)
        # While the new step runs: the last one's tokens, this boundary's
        # decisions, and what the last step's time teaches the cost law.
        self._pass_on()
        if device.inline:
            # Its steps are done when launched: nothing above waited, so the
            # agents get their turn (and a cancellation lands) here.
            await anyio.lowlevel.checkpoint()

    async def _land(self, *, deliver: bool = True) -> None:
        """Take in the step in flight, if there is one, with nothing launched after it."""
        flight, self._flight = self._flight, None
        if flight is not None:
            await self._take_in(*flight)
        if deliver:
            self._pass_on()

    async def _take_in(self, plan: Plan, job: Job[Ran]) -> None:
        """Wait for a step and account it. Cancelled while it runs, the step is
        waited for and accounted all the same (never left running unowned), and
        then the cancellation goes on."""
        try:
            ran = await job.result()
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await self._account(plan, await job.result())
            raise
        await self._account(plan, ran)

    async def _account(self, plan: Plan, ran: Ran) -> None:
        """A step's faults fail their turns, its tokens go to the scheduler and are
        left for _deliver."""
        tokens, faults, spent = ran
        if tokens is None:
            # Abandoned for a turn that outranks it (runtime.abandon): it counts for
            # nothing, and neither does the step planned on it (its flag is up, so
            # the step thread does not start it).
            later, self._flight = self._flight, None
            if later is not None:
                with anyio.CancelScope(shield=True):
                    await later[1].result()
                self.scheduler.retract(later[0])
            self.scheduler.retract(plan)
            self._abandoned(plan)
            self._disarm()
            self._chained = False
            return
        self._disarm(self._flight[0] if self._flight is not None else None)
        if spent is not None:
            self._measured = (*plan.features, spent)
        now = self.bus.now()
        for turn_id, reason in faults.items():
            self.scheduler.fail(turn_id, now, reason)
        # (appended: a boundary with moves takes a step in before the one before it is delivered)
        self._pending += self.scheduler.postprocess(plan, tokens, now)
        self._pending_t = now

    def _pass_on(self) -> None:
        """What the last boundary left to do, done while the next step runs."""
        self._deliver()
        self._publish()
        self._learn()

    def _learn(self) -> None:
        # The law refits every few steps (about 0.3 ms, runtime.cost): while a
        # step runs rather than between two, where the device would wait for it.
        # (So a step's time shapes the step after next, not the next.)
        if self._measured is not None:
            self.engine.cost.observe(*self._measured)
            self._measured = None

    def _deliver(self) -> None:
        pending, self._pending = self._pending, []
        replies, t = self._replies, self._pending_t
        for turn, token in pending:  # (_send, inlined: this runs for every token)
            reply = replies.get(turn.id)
            if reply is None:
                continue
            try:
                reply.send_nowait(Token(turn=turn.id, token=token, t=t))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._hang_up(turn.id)

    def _settle(self, plan: Plan, failed: dict[int, str]) -> None:
        """A turn whose KV move failed has lost its cache: unsay the move and
        have the scheduler re-prefill it, rather than fail it."""
        if not failed:
            return
        self._decided[:] = [e for e in self._decided if not (isinstance(e, (SwappedOut, SwappedIn)) and e.turn in failed)]
        now = self.bus.now()
        for turn_id, why in failed.items():
            log.warning("turn %d: %s; its KV is recomputed", turn_id, why)
            self.engine.forget(turn_id)
            self.scheduler.lose_kv(plan, turn_id, now)

    # -------------------------------------------------------------- updates

    def _publish(self) -> None:
        """Log the scheduler's decisions and tell each turn's agent of its own."""
        decided = self._decided[:]
        self._decided.clear()  # the scheduler appends to this very list
        for event in decided:
            self.bus.emit(event)
            if not isinstance(event, TurnEvent):
                continue
            self._send(event.turn, event)
            if isinstance(event, Ended):
                self.engine.forget(event.turn)
                reply = self._replies.pop(event.turn, None)
                if reply is not None:
                    reply.close()

    def _send(self, turn_id: int, update: TurnUpdate) -> None:
        reply = self._replies.get(turn_id)
        if reply is None:
            return
        try:
            reply.send_nowait(update)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self._hang_up(turn_id)

    def _hang_up(self, turn_id: int) -> None:
        """The agent stopped listening: end the turn at the next boundary."""
        self._replies.pop(turn_id).close()
        self._request(CancelTurn(turn=turn_id, reason="agent stopped listening"))
