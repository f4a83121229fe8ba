"""An actor's life in the system: start, serve its mailbox, run, stop, be buried.

Each spawned actor gets a `Cell` (its mailbox, cancel scope and how it ended)
and one task, `_live`: on_start, then its mailbox served beside its run(), then,
however that ends, the mailbox closed (asks in flight fail, what is left is
offered to on_undelivered), on_stop within the stop timeout, the on_actor_stopped
hooks, and the cell kept a while for late asks. A crash in any of them is one
agent.crashed event. Mixed into `runtime.actors.system.ActorSystem`, whose registry,
bus and hooks it uses.
"""

from __future__ import annotations

import collections
import inspect
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio

from runtime.actors.mailbox import Envelope, Reply, find_handler
from runtime.actors.serving import MAILBOX, on_behalf
from runtime.events.kinds import AgentCrashed

if TYPE_CHECKING:
    from runtime.actors.actor import Actor
    from runtime.actors.waits import WaitGraph
    from runtime.events.bus import EventBus

log = logging.getLogger("runtime.actors.system")  # the system's log: an actor's life is part of it

FINISHED_KEPT = 1024  # finished actors remembered for late asks


class Cell:
    """The system's bookkeeping for one spawned actor."""

    def __init__(self, actor: Actor) -> None:
        self.actor = actor
        self.name = actor.name
        self.send, self.recv = anyio.create_memory_object_stream[Envelope](actor.mailbox_size)
        self.scope = anyio.CancelScope()
        self.ready = anyio.Event()  # on_start has ended, one way or the other
        self.finished = anyio.Event()  # on_stop and the hooks have run
        self.ran = anyio.Event()  # run() has ended (or there is none, or the actor stopped)
        self.pending: dict[Reply, str] = {}  # asks in flight -> message type name
        self.alive = True  # still taking messages
        self.handling = False
        self.crash: str | None = None  # "Type: message", once crashed


class Lifecycles:
    # The system's state this part uses (besides `_made_progress` and `_gone`).
    bus: EventBus
    waits: WaitGraph
    stop_timeout: float
    step_source: Callable[[], int]
    on_actor_stopped: list[Callable[[str], Any]]
    _cells: dict[str, Cell]
    _finished: collections.OrderedDict[str, Cell]

    async def _live(self, cell: Cell) -> None:
        actor = cell.actor
        try:
            with cell.scope:
                try:
                    await actor.on_start()
                except Exception as exc:
                    self._crashed(cell, "on_start", exc)
                    return
                finally:
                    cell.ready.set()
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._serve, cell)
                    run = getattr(actor, "run", None)
                    if run is not None:
                        tg.start_soon(self._run, cell, run)
                    else:
                        cell.ran.set()
        finally:
            cell.ran.set()
            self._close(cell)
            with anyio.CancelScope(shield=True):
                await self._wind_down(cell)

    async def _serve(self, cell: Cell) -> None:
        actor = cell.actor
        async for envelope in cell.recv:
            msg, reply = envelope.msg, envelope.reply
            # The sender already checked that a handler exists.
            method = getattr(actor, find_handler(actor._dispatch, type(msg)))  # type: ignore[arg-type]
            cell.handling = True
            try:
                with on_behalf(MAILBOX):  # turns it starts are lifted while someone waits on this mailbox
                    result = await method(msg)
            except Exception as exc:
                if reply is not None:
                    reply.fail(exc)
                else:
                    log.error(
                        "actor %r: handler %s() failed on a told %s", cell.name, method.__name__, type(msg).__qualname__, exc_info=exc
                    )
            else:
                if reply is not None:
                    reply.succeed(result)
            finally:
                cell.handling = False
                self._made_progress()

    async def _run(self, cell: Cell, run: Callable[[], Any]) -> None:
        try:
            await run()
        except Exception as exc:
            self._crashed(cell, "run", exc)
            cell.scope.cancel()
        finally:
            cell.ran.set()

    def _crashed(self, cell: Cell, where: str, exc: Exception) -> None:
        reason = f"{type(exc).__name__}: {exc}"
        log.error("actor %r crashed in %s(): %s", cell.name, where, reason, exc_info=exc)
        if cell.crash is not None:
            return  # one agent.crashed per actor
        cell.crash = reason
        cell.alive = False
        self.bus.emit(AgentCrashed(t=self.bus.now(), step=self.step_source(), agent=cell.name, reason=reason))

    def _close(self, cell: Cell) -> None:
        """Refuse new messages, fail asks in flight and drop what is left."""
        cell.alive = False
        dropped = 0
        while True:
            try:
                envelope = cell.recv.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break
            if not cell.actor.on_undelivered(envelope.msg):
                dropped += 1
        if dropped:
            log.warning("actor %r stopped with %d undelivered messages; dropped", cell.name, dropped)
        cell.recv.close()  # a sender still blocked on the full mailbox gets ActorCrashed
        cell.send.close()
        for reply, what in list(cell.pending.items()):
            reply.fail(self._gone(cell, what, before_reply=True))
        cell.pending.clear()

    async def _wind_down(self, cell: Cell) -> None:
        with anyio.move_on_after(self.stop_timeout) as deadline:
            try:
                await cell.actor.on_stop()
            except Exception as exc:
                self._crashed(cell, "on_stop", exc)
        if deadline.cancelled_caught:
            log.error("actor %r: on_stop() ran past %s s and was cancelled", cell.name, self.stop_timeout)
        for hook in list(self.on_actor_stopped):
            try:
                result = hook(cell.name)
                if inspect.isawaitable(result):
                    with anyio.move_on_after(self.stop_timeout):
                        await result
            except Exception:
                log.exception("on_actor_stopped hook %r failed for actor %r", hook, cell.name)
        cell.finished.set()
        self._bury(cell)
        self._made_progress()

    def _bury(self, cell: Cell) -> None:
        """Forget a finished actor but for how it ended (see `_finished`)."""
        if self._cells.get(cell.name) is cell:
            del self._cells[cell.name]
            self.waits.forget(cell.name)
        cell.actor = None  # type: ignore[assignment]  # its state is the user's, not ours to keep
        self._finished[cell.name] = cell
        self._finished.move_to_end(cell.name)
        while len(self._finished) > FINISHED_KEPT:
            self._finished.popitem(last=False)
