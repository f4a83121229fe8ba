"""The GPU owner: the one actor that drives the engine, a token at a time.

What reaches it comes through its mailbox (agents use a runtime.owner.client.GPUClient):
turn requests and cancels, and from the actor system, agents that stopped and
priorities lent. Its handler only queues them; its loop, once per token
boundary (`_boundary`), makes five named calls:

    drain requests   intake.drain(): submit, cancel, lend          (runtime.owner.intake)
    schedule         scheduler.schedule(now): admit, preempt, batch
    launch           hand the plan to the step thread: a StepInFlight (runtime.owner.flight)
    land             take in the step launched before: scheduler.postprocess
    deliver          that step's tokens, then the decisions, each on its turn's
                     own channel, while the new step runs

Step N+1 is planned and launched while step N runs, as vLLM's async scheduling
and SGLang's overlap scheduler do: the plan assumes every running decode yields
a token (the scheduler's steps in flight, runtime.scheduling.inflight), and the
step thread, right after step N, puts N's tokens into N+1's decodes and starts
it (StepInFlight.hand_over), before this loop has even heard that N ended. So
the device waits for no host work but that hand-over; a turn that ended at N on
end-of-sequence has its N+1 work thrown away.

A step with KV moves is the exception: the step in flight is landed first, the
moves run, then the step. So is a step after one whose plan says `settle` (a
turn in it may speculate, runtime.scheduling.drafts): it is planned once that
one has landed. Requests are only ever applied at a boundary, and
every device call (steps, moves) runs in the one step thread in the order
planned, so blocks a cancelled or finished turn frees are reused only by steps
that run after any step still using them.

The owner is built from parts it owns, each in its own module: `Intake`
(requests waiting for a boundary), `StepAbandon` (the flag that stops a step
for a turn that outranks it), `DeviceWork` (what runs in the step thread, and
its figures) and the `Scheduler`.
"""

from __future__ import annotations

import collections
import logging
import math

import anyio
import msgspec

from runtime.actors.actor import Actor, handler
from runtime.actors.channel import UpdateSender
from runtime.actors.serving import lift_key
from runtime.events.bus import EventBus
from runtime.events.kinds import Ended, Event, Progress, TurnEvent
from runtime.owner.abandon import StepAbandon
from runtime.owner.devicework import STEP_HISTORY, DeviceWork
from runtime.owner.drafter import DraftModel
from runtime.owner.flight import Ran, StepInFlight
from runtime.owner.intake import STOPPED, Intake
from runtime.owner.messages import CancelAgent, CancelTurn, OwnerRequest, SetInherited, Token, TurnRequest, TurnUpdate
from runtime.owner.stepthread import StepThread
from runtime.scheduling.blocks import BlockPool
from runtime.scheduling.priority import FOREGROUND
from runtime.scheduling.scheduler import Scheduler
from runtime.scheduling.turns import Plan, SchedulerConfig, Turn
from runtime.scheduling.work import Engine

log = logging.getLogger(__name__)

__all__ = ["GPUOwner", "STEP_HISTORY"]


class GPUOwner(Actor):
    mailbox_size = math.inf  # a request is never refused for room: the handler only queues it

    def __init__(
        self, engine: Engine, config: SchedulerConfig, bus: EventBus, *, name: str = "gpu", drafter: DraftModel | None = None
    ) -> None:
        super().__init__(name, FOREGROUND)
        self.engine = engine
        self.drafter = drafter  # the draft model, where one makes drafts (runtime.owner.drafter)
        self.bus = bus
        self._decided: list[Event] = []
        self.scheduler = Scheduler(
            config,
            BlockPool(engine.num_blocks, engine.block_size, namespace=engine.model_id),
            eos_token_ids=engine.eos_token_ids,
            vocab_size=engine.vocab_size,
            emit=self._decided.append,
            cost=engine.cost,
            draft_cost=drafter.cost if drafter is not None else None,
        )
        # Turn id -> where its updates go, from its request's intake to its end.
        self.replies: dict[int, UpdateSender[TurnUpdate]] = {}
        self.intake = Intake(self.scheduler, bus, self.replies)
        self.abandon = StepAbandon(self.scheduler, bus)
        self.device = DeviceWork(engine, drafter)
        # The last step's tokens, not yet delivered, and when they were sampled (made
        # into Token messages as they are sent, while the next step runs).
        self._pending: list[tuple[Turn, int]] = []
        self._pending_t = 0.0
        self._measured: tuple[int, int, float] | None = None  # the last step's (tokens, kv reads, seconds), not yet learned
        self._flight: StepInFlight | None = None  # the newest step launched and not yet landed
        self._chained = False  # whether the next step follows one at once (else the device was idle)

    # The owner's figures, kept by the part that runs the steps.

    @property
    def steps_run(self) -> int:
        return self.device.steps_run

    @property
    def step_seconds(self) -> collections.deque[float]:
        """Wall time of the latest engine steps."""
        return self.device.step_seconds

    @property
    def overhead_seconds(self) -> collections.deque[float]:
        """The owner's host time per step that the step did not hide: from a
        step's end to the next one's start, for steps launched back to back."""
        return self.device.gap_seconds

    gap_seconds = overhead_seconds

    @property
    def steps_abandoned(self) -> int:
        return self.abandon.steps_abandoned

    # ---------------------------------------------------------------- hooks

    async def on_start(self) -> None:
        # Before any turn: the step shaping needs to know what a step costs here.
        await anyio.to_thread.run_sync(self.engine.calibrate)
        if self.drafter is not None:
            await anyio.to_thread.run_sync(self.drafter.calibrate)
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

    def _request(self, request: OwnerRequest) -> None:
        turn = self.intake.put(request)
        if turn is not None:
            self.abandon.notice(turn)  # it may outrank the step in flight

    def on_undelivered(self, msg: msgspec.Struct) -> bool:
        # A request still in the mailbox at shutdown is taken by on_stop like the
        # rest, so its turn ends in a terminal event instead of hanging its agent.
        self._request(msg)  # type: ignore[arg-type]
        return True

    async def on_stop(self) -> None:
        # Every turn ends in exactly one terminal event, even at shutdown.
        try:
            self._deliver_tokens()
            self.intake.drain()
            now = self.bus.now()
            for turn_id in list(self.scheduler.turns):
                self.scheduler.cancel(turn_id, now, STOPPED)
            self._publish()
            if self.drafter is not None:
                self.drafter.collect()  # (the step thread is gone: this is the last word)
        finally:
            # Even if the owner died of a bug and the above failed too: no agent is
            # left waiting on a turn (a channel closed without an end reads as
            # TurnFailed "the GPU owner stopped").
            self.intake.hang_up()
            for reply in self.replies.values():
                reply.close()
            self.replies.clear()

    # ----------------------------------------------------------------- loop

    async def run(self) -> None:
        with StepThread(f"{self.name}-step", inline=not self.engine.blocking) as device:
            try:
                while True:
                    await self._boundary(device)
            finally:
                # Never leave a step running unowned: it is landed (its tokens
                # delivered) before the step thread is left.
                with anyio.CancelScope(shield=True):
                    try:
                        await self._land_all()
                        self._deliver()
                    except Exception:
                        log.exception("GPU owner: the step in flight could not be taken in")
                    if self.drafter is not None:
                        self.drafter.collect()  # (the turns' ends are told; nothing runs in the step thread)

    async def _boundary(self, device: StepThread) -> None:
        """One token boundary: drain requests, schedule, launch the new step,
        land the one before it, and deliver while the new one runs."""
        if not self.scheduler.turns and self._flight is None:
            self._deliver()
            self._chained = False
            if self.drafter is not None:
                self.drafter.collect()  # (nothing runs in the step thread now)
            await self.intake.wait()  # idle: sleep until asked
        if self._flight is not None and (self.abandon.raised or self._flight.plan.settle):
            # It is being abandoned (runtime.owner.abandon): planned after it is landed,
            # this boundary plans on what counts. Or a turn in it may speculate
            # (runtime.scheduling.drafts): its drafts follow its last token, and
            # how many a verify step keeps says where it goes on.
            await self._land_all()
        self.intake.drain()
        planned_on = self._flight  # its tokens feed this plan's decodes, even if it lands before the launch
        plan = self.scheduler.schedule(self.bus.now())
        if plan.moves:
            # A move touches blocks the step in flight may use, and one that fails
            # changes this plan (and is not to be reported as made): the step in
            # flight is landed first, then the moves run, then this step. It is
            # no longer abandoned then: this plan counts on it.
            self.abandon.disarm()
            await self._land_all()
            self._settle_moves(plan, await device.submit(self.device.run_moves, plan).result())
        if not plan.works:
            # (Every running turn may be owed its last token by the step in flight:
            # once that is landed, the next boundary has slots to give.)
            idle = self._flight is None
            await self._land_all()
            self._deliver()
            self._chained = False
            if idle and self.scheduler.turns:
                # Nothing could run this boundary (memory was being freed):
                # look again soon, or as soon as something changes.
                with anyio.move_on_after(0.05):
                    await self.intake.wait()
            return
        before = self._launch(plan, planned_on, device)
        if before is not None:
            await self._land(before)
        self._deliver()
        if device.inline:
            # Its steps are done when launched: nothing above waited, so the
            # agents get their turn (and a cancellation lands) here.
            await anyio.lowlevel.checkpoint()

    def _launch(self, plan: Plan, planned_on: StepInFlight | None, device: StepThread) -> StepInFlight | None:
        """Hand the plan's step to the step thread, before the step in flight has
        even ended: the step thread puts the tokens of the step it was planned
        on into this one's decodes and starts it at once, so the device does not
        wait for this loop. Returns the step that was in flight, to be landed."""
        self.scheduler.advance(plan)
        before = self._flight
        flag = self.abandon.arm(plan, self.intake.waiting_turns(), before.plan if before is not None else None)
        flight = StepInFlight(plan, planned_on, flag, chained=self._chained)
        flight.job = device.submit(self.device.run_step, flight)
        self._chained = True
        self._flight = flight
        return before

    async def _land_all(self) -> None:
        """Land the step in flight, if there is one, with nothing launched after it."""
        flight, self._flight = self._flight, None
        if flight is not None:
            await self._land(flight)

    async def _land(self, flight: StepInFlight) -> None:
        """Wait for a step and account it. Cancelled while it runs, the step is
        waited for and accounted all the same (never left running unowned), and
        then the cancellation goes on."""
        assert flight.job is not None
        try:
            ran = await flight.job.result()
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await self._account(flight, await flight.job.result())
            raise
        await self._account(flight, ran)

    async def _account(self, flight: StepInFlight, ran: Ran) -> None:
        """A step's faults fail their turns, its tokens go to the scheduler and are
        left for `_deliver`."""
        tokens, faults, spent = ran
        plan = flight.plan
        if tokens is None:
            # Abandoned for a turn that outranks it (runtime.owner.abandon): it counts for
            # nothing, and neither does the step planned on it (its flag is up, so
            # the step thread does not start it).
            later, self._flight = self._flight, None
            if later is not None:
                assert later.job is not None
                with anyio.CancelScope(shield=True):
                    await later.job.result()
                self.scheduler.discard(later.plan)
            self.scheduler.discard(plan)
            self.abandon.abandoned(plan)
            self.abandon.disarm()
            self._chained = False
            return
        self.abandon.disarm(self._flight.plan if self._flight is not None else None)
        if spent is not None:
            self._measured = (*plan.features, spent)
        now = self.bus.now()
        for turn_id, reason in faults.items():
            self.scheduler.fail(turn_id, now, reason)
        # (appended: a boundary with moves lands a step before the one before it is delivered)
        self._pending += self.scheduler.postprocess(plan, tokens, now, drafted=flight.drafted)
        self._pending_t = now
        self.scheduler.tell_progress(now)

    def _deliver(self) -> None:
        """What the last boundary left to do, done while the next step runs: the
        tokens, the decisions, and what the last step's time teaches the cost law."""
        self._deliver_tokens()
        self._publish()
        self._learn()

    def _learn(self) -> None:
        # The law refits every few steps (runtime.scheduling.cost): while a step runs rather
        # than between two, where the device would wait for it. (So a step's time
        # shapes the step after next, not the next.)
        if self._measured is not None:
            self.engine.cost.observe(*self._measured)
            self._measured = None
        if self.drafter is not None:
            self.drafter.teach()

    def _deliver_tokens(self) -> None:
        pending, self._pending = self._pending, []
        replies, t = self.replies, self._pending_t
        for turn, token in pending:  # (_send, inlined: this runs for every token)
            reply = replies.get(turn.id)
            if reply is None:
                continue
            try:
                reply.send_nowait(Token(turn=turn.id, token=token, t=t))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._hang_up(turn.id)

    def _settle_moves(self, plan: Plan, failed: dict[int, str]) -> None:
        """The moves made are told; a turn whose KV move failed has lost its
        cache, and the scheduler re-prefills it rather than fail it."""
        for turn_id, why in failed.items():
            log.warning("turn %d: %s; its KV is recomputed", turn_id, why)
            self.engine.forget(turn_id)
        self.scheduler.settle_moves(plan, failed, self.bus.now())

    # -------------------------------------------------------------- updates

    def _publish(self) -> None:
        """Log the scheduler's decisions and tell each turn's agent of its own."""
        decided = self._decided[:]
        self._decided.clear()  # the scheduler appends to this very list
        for event in decided:
            self.bus.emit(event)
            if not isinstance(event, TurnEvent) or type(event) is Progress:
                continue  # (a turn's reader counts its own tokens: progress is for the viewers)
            self._send(event.turn, event)
            if isinstance(event, Ended):
                self.engine.forget(event.turn)
                if self.drafter is not None:
                    self.drafter.forget(event.turn)
                reply = self.replies.pop(event.turn, None)
                if reply is not None:
                    reply.close()

    def _send(self, turn_id: int, update: TurnUpdate) -> None:
        reply = self.replies.get(turn_id)
        if reply is None:
            return
        try:
            reply.send_nowait(update)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self._hang_up(turn_id)

    def _hang_up(self, turn_id: int) -> None:
        """The agent stopped listening: end the turn at the next boundary."""
        self.replies.pop(turn_id).close()
        self._request(CancelTurn(turn=turn_id, reason="agent stopped listening"))
