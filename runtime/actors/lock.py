"""A lock shared between agents that lends priority to whoever holds it.

    tools = Lock("tools")
    async with tools(self):          # self: the Actor taking it
        ...

While an actor waits for the lock, the wait graph records a wait from it to the
current holder, so a background holder runs at the priority of a foreground
waiter until it lets go (the Mars Pathfinder fix). What is lifted is the critical
section (the body of `async with lock(self)`), not everything the holder does:
turns it starts there run at the waiter's priority, its other turns at its own.
When the lock passes on, the remaining waiters' waits are re-pointed at the new
holder.

Rules:
- The owner is an actor (by name), not a task, and the lock is not re-entrant:
  taking a lock you hold raises WaitCycle, as does a wait that would close a
  cycle (A holds L1 and waits on L2 held by B, who waits on L1).
- The next holder is the waiter with the highest effective priority at release
  time, the earliest arrival among equals.
- Cancelled while waiting: the wait is withdrawn and nothing is left behind; if
  the lock was granted at that very moment, it is passed on at once.
- The lock finds the wait graph through the Actor that takes it
  (`actor.system.waits`); to take it by plain agent name, build it with
  `Lock(name, waits=system.waits)`. One lock serves one ActorSystem.
- Prefer `async with`: an actor that dies holding a lock taken with `take()`
  and never released leaves it held.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from runtime.actors.actor import Actor
from runtime.actors.serving import on_behalf
from runtime.actors.waits import WaitGraph, WaitHandle
from runtime.errors import ActorError, UsageError, WaitCycle

Owner = Actor | str


class _Waiter:
    __slots__ = ("name", "arrival", "handle", "granted", "error")

    def __init__(self, name: str, arrival: int, handle: WaitHandle) -> None:
        self.name = name
        self.arrival = arrival
        self.handle = handle
        self.granted = anyio.Event()  # set when it holds the lock, or when `error` is set
        self.error: WaitCycle | None = None


class Lock:
    def __init__(self, name: str, waits: WaitGraph | None = None) -> None:
        self.name = name
        self._waits = waits
        self._holder: str | None = None
        self._queue: list[_Waiter] = []
        self._arrivals = itertools.count()

    @property
    def via(self) -> str:
        """The part of its holder a waiter waits on (runtime.actors.waits)."""
        return f"lock:{self.name}"

    @property
    def holder(self) -> str | None:
        return self._holder

    @property
    def waiting(self) -> list[str]:
        """Names of the actors waiting, in arrival order."""
        return [w.name for w in self._queue]

    def __call__(self, owner: Owner) -> AsyncIterator[None]:
        return self.acquire(owner)

    @asynccontextmanager
    async def acquire(self, owner: Owner) -> AsyncIterator[None]:
        await self.take(owner)
        try:
            with on_behalf(self.via):  # the critical section is what waiters lift
                yield
        finally:
            self.release(owner)

    async def take(self, owner: Owner) -> None:
        """Wait until `owner` holds the lock."""
        name, graph = self._resolve(owner)
        if self._holder is None:
            # The lock passes straight from holder to waiter, so a free lock
            # has nobody queued.
            self._holder = name
            return
        waiter = _Waiter(name, next(self._arrivals), graph.wait(name, self._holder, self.via, f"lock {self.name}"))
        self._queue.append(waiter)
        try:
            await waiter.granted.wait()
        except BaseException:
            if waiter in self._queue:
                self._queue.remove(waiter)
            elif self._holder == name and waiter.error is None:
                self._pass_on()  # granted as we were cancelled: hand it on
            raise
        finally:
            graph.release(waiter.handle)
        if waiter.error is not None:
            raise waiter.error

    def release(self, owner: Owner) -> None:
        if not isinstance(owner, (str, Actor)):
            raise UsageError(f"lock {self.name!r} is released by an Actor or an agent name, not {owner!r}")
        name = owner if isinstance(owner, str) else owner.name
        if self._holder != name:
            held = f"it is held by {self._holder!r}" if self._holder else "it is not held"
            raise ActorError(f"{name!r} cannot release lock {self.name!r}: {held}")
        self._pass_on()

    def _pass_on(self) -> None:
        self._holder = None
        if not self._queue:
            return
        graph = self._waits
        assert graph is not None  # someone queued, so someone resolved it
        # The most urgent waiting code goes first: what its wait lends, not its agent's
        # whole priority (a foreground agent's background task queues as background).
        nxt = max(self._queue, key=lambda w: (graph.priority_of(w.handle), -w.arrival))
        self._queue.remove(nxt)
        self._holder = nxt.name
        graph.release(nxt.handle)
        nxt.granted.set()
        for waiter in list(self._queue):
            try:
                handle = graph.wait(waiter.name, nxt.name, self.via, f"lock {self.name}", serves=waiter.handle.serves)
            except WaitCycle as err:
                # The new holder (another task of the same actor, or an actor
                # now waiting on this waiter) would close a cycle: fail fast.
                self._queue.remove(waiter)
                waiter.error = err
                waiter.granted.set()
                continue
            graph.release(waiter.handle)
            waiter.handle = handle

    def _resolve(self, owner: Owner) -> tuple[str, WaitGraph]:
        if isinstance(owner, str):
            if self._waits is None:
                raise ActorError(
                    f"lock {self.name!r} is taken by name {owner!r} but has no wait graph: "
                    "build it with Lock(name, waits=system.waits) or pass the Actor"
                )
            return owner, self._waits
        if not isinstance(owner, Actor):
            raise UsageError(f"lock {self.name!r} is taken by an Actor or an agent name, not {owner!r}")
        graph = owner.system.waits
        if self._waits is None:
            self._waits = graph
        elif self._waits is not graph:
            raise ActorError(f"lock {self.name!r} belongs to another ActorSystem than {owner.name!r}")
        return owner.name, graph

    def __repr__(self) -> str:
        return f"<Lock {self.name!r} held by {self._holder!r}, {len(self._queue)} waiting>"
