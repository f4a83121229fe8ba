"""The GPU owner: the one actor that drives the engine, a token at a time.

What reaches it comes through its mailbox (agents use runtime.client.GPUClient):
turn requests and cancels, and from the actor system, agents that stopped and
priorities lent. Its handler only queues them; its loop, once per token boundary:

    take what has arrived into the scheduler       (submit, cancel, inherit)
    plan = scheduler.schedule(now)                  (admit, preempt, resume)
    move KV, start the engine step in the step thread
    while it runs: deliver the previous step's tokens, then the decisions,
                   each on its turn's own channel
    scheduler.postprocess(...)                      (finish, count)

The host work a step's tokens cause (waking agents, events) overlaps the next
step on the device, as in vLLM's async scheduling and SGLang's overlap
scheduler: only postprocess, schedule and the launch lie between two steps.
Requests are only ever applied at a boundary, never while a step runs, so a
cancelled turn's blocks are freed when no step can be using them (taking them in
is runtime.intake).
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time

import anyio
import msgspec

from runtime.abandon import StepAbandon
from runtime.actors import Actor, handler
from runtime.blocks import BlockPool
from runtime.cost import step_features
from runtime.engine import Engine
from runtime.bus import EventBus
from runtime.channel import UpdateSender
from runtime.events import Ended, Event, SwappedIn, SwappedOut, TurnEvent
from runtime.intake import STOPPED, Intake
from runtime.messages import CancelAgent, CancelTurn, OwnerRequest, SetInherited, Token, TurnChannel, TurnRequest, TurnUpdate
from runtime.priority import FOREGROUND
from runtime.scheduler import Scheduler
from runtime.serving import lift_key
from runtime.stepthread import StepThread
from runtime.turns import Plan, SchedulerConfig, Turn

log = logging.getLogger(__name__)

STEP_HISTORY = 10_000


class GPUOwner(Intake, StepAbandon, Actor):
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
        # The rest of each boundary: scheduling, KV moves, telling the agents.
        self.overhead_seconds: collections.deque[float] = collections.deque(maxlen=STEP_HISTORY)
        self.steps_run = 0
        self._faults: dict[int, str] = {}  # turn -> the engine error it alone caused this step
        # host time from a step's end to the next step's start (the device idles)
        self.gap_seconds: collections.deque[float] = collections.deque(maxlen=STEP_HISTORY)
        # The last step's tokens, not yet delivered, and when they were sampled (made
        # into Token messages as they are sent, while the next step runs).
        self._pending: list[tuple[Turn, int]] = []
        self._pending_t = 0.0
        self._measured: tuple[int, int, float] | None = None  # the last step's (tokens, kv reads, seconds), not yet learned
        self._step_ended: float | None = None
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
        with StepThread(f"{self.name}-step") as device:
            while True:
                await self._boundary(device)

    async def _boundary(self, device: StepThread) -> None:
        """One token boundary: plan, launch the step, deliver the last one's tokens."""
        if not self.scheduler.turns:
            self._pass_on()
            self._step_ended = None
            await self._wait_for_request()  # idle: sleep until asked
        started = time.perf_counter()
        self._drain()
        plan = self.scheduler.schedule(self.bus.now())
        if plan.moves:
            # Before the decisions are told: a move that fails is not reported as made.
            self._settle(plan, await anyio.to_thread.run_sync(self._move, plan))
        if not plan.works:
            self._pass_on()
            self._step_ended = None
            if self.scheduler.turns:
                # Nothing could run this boundary (memory was being freed):
                # look again soon, or as soon as something changes.
                with anyio.move_on_after(0.05):
                    await self._wait_for_request()
            return
        step = device.submit(self._execute, (plan, self._arm(plan, list(self._arrived))))
        if self._step_ended is not None:
            self.gap_seconds.append(time.perf_counter() - self._step_ended)
        # While the device works: what the last step produced, this boundary's
        # decisions, and what the last step's time teaches the cost law.
        self._pass_on()
        try:
            with anyio.CancelScope(shield=True):  # never leave a step running unowned
                tokens = await step.result()
        except Exception as exc:
            log.warning("engine step failed (%s: %s); running its turns one by one", type(exc).__name__, exc)
            tokens = await anyio.to_thread.run_sync(self._isolate, plan)
            self._step_ended, spent = None, 0.0
        else:
            if tokens is None:  # abandoned for a turn that outranks it (runtime.abandon)
                self._abandoned(plan)
                self._step_ended = time.perf_counter()
                return
            self._step_ended, spent = time.perf_counter(), self.step_seconds[-1]
            self._measured = (*step_features(plan.works), spent)
        finally:
            self._disarm()
        now = self.bus.now()
        for turn_id, reason in self._faults.items():
            self.scheduler.fail(turn_id, now, reason)
        self._faults.clear()
        self._pending, self._pending_t = self.scheduler.postprocess(plan, tokens, now), now
        # Host time of this boundary not hidden behind the step (the delivery is).
        self.overhead_seconds.append(max(0.0, time.perf_counter() - started - spent))
        # A cancellation lands here, between steps. (Only if there is one: the
        # boundary has yielded already, waiting for its step, and a plain
        # checkpoint would cost every step another trip through the event loop.)
        await anyio.lowlevel.checkpoint_if_cancelled()

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

    def _execute(self, job: tuple[Plan, threading.Event | None]) -> list[int | None] | None:
        """Runs in a worker thread: the blocking device work of one step (None: it
        was abandoned, and counts for nothing)."""
        plan, abandon = job
        started = time.perf_counter()
        tokens = self.engine.step(plan.works, abandon)
        if tokens is None:
            return None
        self.step_seconds.append(time.perf_counter() - started)  # KV moves excluded: the law prices the step
        self.steps_run += 1
        return tokens

    def _isolate(self, plan: Plan) -> list[int | None]:
        """Runs in a worker thread after a failed step: each turn's work alone, so
        an error is pinned on the turn that causes it and the others go on. (Running
        a work again is exact: it rewrites the same K/V at the same positions, and
        sampling depends only on the turn's seed and position.)"""
        tokens: list[int | None] = []
        for work in plan.works:
            try:
                tokens += self.engine.step([work])
            except Exception as exc:
                self._faults[work.turn] = f"engine error: {type(exc).__name__}: {exc}"
                tokens.append(None)
        return tokens

    def _move(self, plan: Plan) -> dict[int, str]:
        """Runs in a worker thread: the plan's KV moves, in the order decided.
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
