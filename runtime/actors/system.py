"""The ActorSystem: spawns actors into one anyio task group, carries their
messages, records every ask in the wait graph and turns crashes into events.
What it promises is written down in `runtime.actors.actor`."""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import anyio
import msgspec

from runtime.actors.actor import Actor, Ref, Target
from runtime.actors.lifecycle import Cell, Lifecycles
from runtime.actors.mailbox import Envelope, Reply, find_handler, handled_names
from runtime.actors.serving import MAILBOX
from runtime.actors.waits import WaitGraph
from runtime.errors import ActorCrashed, ActorError, AskTimeout, UnhandledMessage, UsageError
from runtime.events.bus import EventBus
from runtime.events.kinds import Inherited, Restored

__all__ = ["ActorSystem"]

log = logging.getLogger(__name__)


def check_timeout(timeout: object) -> None:
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0 or timeout != timeout:
        raise UsageError(f"timeout must be None or a number of seconds >= 0, got {timeout!r}")


class ActorSystem(Lifecycles):
    """Owns the actors' tasks (one anyio task group), the wait graph and the
    hook lists. `step_source` gives the decode step stamped on events; the GPU
    owner sets it."""

    def __init__(self, bus: EventBus | None = None, *, stop_timeout: float = 10.0) -> None:
        self.bus = bus if bus is not None else EventBus()
        self.step_source: Callable[[], int] = lambda: 0
        self.waits = WaitGraph(self._priority_changed, self._lifted)
        self.stop_timeout = stop_timeout
        # Called with the actor's name once it has stopped (crashed or not),
        # after its on_stop. Plain functions or coroutine functions.
        self.on_actor_stopped: list[Callable[[str], Any]] = []
        # Called with (agent, effective, inherited or None) when the priority an
        # agent borrows changes. Plain functions: they run inside the graph update.
        self.on_priority_change: list[Callable[[str, int, int | None], None]] = []
        # Called with (agent, via, priority or None) when what one part of an agent
        # (runtime.actors.waits: its mailbox, a lock's critical section) is lent changes.
        self.on_lift: list[Callable[[str, str, int | None], None]] = []
        self._cells: dict[str, Cell] = {}  # every actor not yet finished
        # The last few finished actors, so a late ask still hears how they ended;
        # bounded, so a swarm that churns through agents does not grow.
        self._finished: collections.OrderedDict[str, Cell] = collections.OrderedDict()
        self._tg: anyio.abc.TaskGroup | None = None
        self._closing = False
        self._progress: anyio.Event | None = None

    async def __aenter__(self) -> ActorSystem:
        if self._tg is not None:
            raise ActorError("this ActorSystem is already running")
        self._closing = False
        self._progress = anyio.Event()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        self._closing = True
        for cell in self._cells.values():
            cell.scope.cancel()
        tg, self._tg = self._tg, None
        assert tg is not None
        exc_type = exc_info[0]
        if exc_type is not None and issubclass(exc_type, Exception):
            # The body failed: wait for the actors to wind down, then let its
            # error propagate as itself rather than wrapped in an ExceptionGroup
            # (actor tasks never raise; they report through the bus and asks).
            await tg.__aexit__(None, None, None)
            return None
        return await tg.__aexit__(*exc_info)

    # ---- lifecycle --------------------------------------------------------

    async def spawn(self, actor: Actor) -> Ref:
        """Start `actor` and return once its on_start has ended. If on_start
        raised, the actor is already dead (see the module doc) but spawn returns."""
        if self._tg is None or self._closing:
            raise ActorError("the actor system is not running: use `async with ActorSystem(bus) as system`")
        if not isinstance(actor, Actor) or "name" not in vars(actor):
            raise UsageError(f"spawn takes an Actor whose __init__ called super().__init__(name), got {type(actor).__qualname__}")
        if actor._system is not None:
            raise ActorError(f"actor {actor.name!r} is already spawned")
        if actor.name in self._cells:
            raise ActorError(f"an actor named {actor.name!r} is already running")
        cell = Cell(actor)
        self._cells[actor.name] = cell
        self._finished.pop(actor.name, None)
        actor._system = self
        self.waits.set_base(actor.name, actor.priority)
        self._tg.start_soon(self._live, cell, name=f"actor {actor.name}")
        await cell.ready.wait()
        return Ref(actor.name, self)

    async def stop(self, *targets: Target) -> None:
        """Stop actors and wait until their on_stop and hooks have run. Several
        are cancelled together before any is waited for, so none runs on while
        another winds down. Stopping a stopped actor does nothing."""
        cells = [self._cell(target) for target in targets]
        for cell in cells:
            cell.scope.cancel()
        for cell in cells:
            await cell.finished.wait()

    async def join(self, target: Target) -> None:
        """Wait until an actor has stopped (crashed or stopped)."""
        await self._cell(target).finished.wait()

    async def wait_run(self, target: Target) -> None:
        """Wait until an actor's run() has ended: returned, crashed, or stopped.
        (An actor whose run() returns keeps serving its mailbox.)"""
        await self._cell(target).ran.wait()

    async def wait_idle(self) -> None:
        """Wait until every live mailbox is empty and no handler is running.
        run() loops are not counted: they may run forever. For code outside the
        actors (tests, the CLI): a handler calling it would wait on itself."""
        while not self._idle():
            assert self._progress is not None
            await self._progress.wait()

    def ref(self, name: str) -> Ref:
        self._cell(name)
        return Ref(name, self)

    def is_alive(self, name: str) -> bool:
        cell = self._cells.get(name)
        return cell is not None and cell.alive

    def names(self) -> list[str]:
        """Every live actor, in spawn order."""
        return [name for name, cell in self._cells.items() if cell.alive]

    # ---- messages ---------------------------------------------------------

    async def tell(self, target: Target, msg: msgspec.Struct, *, sender: str | None = None) -> None:
        """Put `msg` in the target's mailbox; returns once it is there (waiting
        while the mailbox is full). A message of a type the target does not
        handle is logged, not delivered."""
        cell = self._cell(target)
        self._check_message(cell, msg)
        if find_handler(cell.actor._dispatch, type(msg)) is None:
            log.error("%s", self._unhandled(cell, msg))
            return
        envelope = Envelope(msg, None, sender)
        try:
            try:
                cell.send.send_nowait(envelope)
            except anyio.WouldBlock:
                with self._waiting(sender, cell.name, type(msg).__qualname__):
                    await cell.send.send(envelope)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            raise self._gone(cell, type(msg).__qualname__) from None

    async def ask(self, target: Target, msg: msgspec.Struct, *, timeout: float | None = None, sender: str | None = None) -> Any:
        """Send `msg` and wait for the handler's return value (or its exception)."""
        check_timeout(timeout)
        cell = self._cell(target)
        self._check_message(cell, msg)
        what = type(msg).__qualname__
        if find_handler(cell.actor._dispatch, type(msg)) is None:
            raise self._unhandled(cell, msg)
        reply = Reply()
        with self._waiting(sender, cell.name, what):
            cell.pending[reply] = what
            try:
                with anyio.move_on_after(timeout):
                    try:
                        await cell.send.send(Envelope(msg, reply, sender))
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                        raise self._gone(cell, what) from None
                    await reply.done.wait()
            finally:
                cell.pending.pop(reply, None)
        if reply.done.is_set():
            return reply.result()
        raise AskTimeout(f"no reply from actor {cell.name!r} to {what} within {timeout} s", agent=cell.name)

    # ---- internals --------------------------------------------------------

    def _cell(self, target: Target) -> Cell:
        name = target if isinstance(target, str) else getattr(target, "name", None)
        if not isinstance(name, str) or not isinstance(target, (str, Actor, Ref)):
            raise UsageError(f"a message goes to an actor name, Actor or Ref, not {target!r}")
        cell = self._cells.get(name) or self._finished.get(name)
        if cell is None:
            raise ActorError(f"no actor named {name!r} (known: {', '.join(self._cells) or 'none'})")
        return cell

    def _check_message(self, cell: Cell, msg: object) -> None:
        if not isinstance(msg, msgspec.Struct):
            raise UsageError(f"messages must be msgspec.Struct instances, got {type(msg).__qualname__}")
        if not cell.alive:
            raise self._gone(cell, type(msg).__qualname__)

    def _unhandled(self, cell: Cell, msg: msgspec.Struct) -> UnhandledMessage:
        actor = cell.actor
        return UnhandledMessage(
            f"actor {cell.name!r} ({type(actor).__qualname__}) has no handler for {type(msg).__qualname__}; "
            f"it handles: {handled_names(actor._dispatch)}",
            agent=cell.name,
        )

    def _gone(self, cell: Cell, what: str, *, before_reply: bool = False) -> ActorCrashed:
        state = f"crashed ({cell.crash})" if cell.crash else "stopped"
        if before_reply:
            return ActorCrashed(f"actor {cell.name!r} {state} before replying to {what}", agent=cell.name, reason=cell.crash)
        return ActorCrashed(f"actor {cell.name!r} has {state}; it cannot take {what}", agent=cell.name, reason=cell.crash)

    def _waiting(self, sender: str | None, holder: str, request: str) -> AbstractContextManager[object]:
        # On the holder's mailbox: whatever handler it runs until this one is served is in the way.
        return nullcontext() if sender is None else self.waits.waiting(sender, holder, MAILBOX, request)

    def _idle(self) -> bool:
        for cell in self._cells.values():
            if not cell.alive:
                continue
            stats = cell.recv.statistics()
            if cell.handling or stats.current_buffer_used or stats.tasks_waiting_send:
                return False
        return True

    def _made_progress(self) -> None:
        assert self._progress is not None
        self._progress.set()
        self._progress = anyio.Event()

    def _priority_changed(self, agent: str, effective: int, inherited: int | None, origin: str | None) -> None:
        base = self.waits.base(agent)
        t, step = self.bus.now(), self.step_source()
        if inherited is None:
            event = Restored(t=t, step=step, agent=agent, priority=effective, base_priority=base)
        else:
            serves = self.waits.serves(agent)
            event = Inherited(
                t=t, step=step, agent=agent, priority=effective, by_agent=origin, base_priority=base, request="; ".join(serves) or None
            )
        self.bus.emit(event)
        for hook in list(self.on_priority_change):
            try:
                hook(agent, effective, inherited)
            except Exception:
                log.exception("on_priority_change hook %r failed for %r", hook, agent)

    def _lifted(self, agent: str, via: str, priority: int | None) -> None:
        for hook in list(self.on_lift):
            try:
                hook(agent, via, priority)
            except Exception:
                log.exception("on_lift hook %r failed for %r", hook, agent)
