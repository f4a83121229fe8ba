"""One GPU owner inside a Ray actor: today's owner loop and scheduler, unchanged,
behind the few calls a driver makes across processes.

The host runs a whole `Swarm` with no agents of its own. Its `serve` call holds
the swarm's task group open for the actor's life; every other call is a short
coroutine (or an async generator, which Ray streams) on the same event loop.
Turn ids come from the driver, so a turn keeps its id wherever it runs and the
merged event stream never confuses two turns.

What flows back is batched: one stream of every turn's updates and one of
events, each item holding whatever arrived since the last. A step of 64 turns
is then one Ray object to the driver, not 64; per-token objects were the first
thing to give out as owners are added.
"""

from __future__ import annotations

import math
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from typing import Any, TypeVar

import anyio
import msgspec

from runtime.events.kinds import encode
from runtime.owner.messages import SetInherited, TurnChannel, TurnRequest

T = TypeVar("T")


class OwnerSpec(msgspec.Struct, frozen=True, kw_only=True):
    """How to build one owner: what `Swarm` and `open_engine` take, as data that
    crosses to the Ray worker."""

    name: str
    model: str | None = None  # a path or catalogue name; None: the default model
    device: str | None = None
    kernels: str | None = None
    num_blocks: int | None = None
    slots: int = 8
    policy: str = "resident"
    step_tokens: int | None = None
    shaping: bool = True
    slack: float = 0.25
    prefix_cache: bool = True
    abandon_steps: bool = True
    speculate: str = "off"  # "off", "lookup", "draft" or "draft:MODEL" (runtime.scheduling.drafts)


class OwnerInfo(msgspec.Struct, frozen=True):
    name: str
    device: str
    model: str
    pid: int
    unix_start: float  # the owner's clock zero, to line its events up with the driver's


class OwnerHost:
    """The Ray actor's class (wrapped with `ray.remote` by `swarm.cluster.start`)."""

    def __init__(self, spec: OwnerSpec) -> None:
        self.spec = spec
        self._swarm: Any = None
        self._ready = anyio.Event()
        self._stop = anyio.Event()
        self._failure: str | None = None
        # (turn id, update) for every turn started here, in the order they happened.
        self._outbox, self._updates = anyio.create_memory_object_stream[tuple[int, Any]](math.inf)
        self._forwarding: set[int] = set()  # turns whose updates are still coming
        self._tasks: Any = None

    async def serve(self) -> None:
        """Open the engine and run the owner until `stop`. Runs for the actor's life."""
        from gpu.engine import open_engine  # the driver need not import the GPU stack
        from swarm.api import Swarm

        spec = self.spec
        try:
            engine = await anyio.to_thread.run_sync(
                lambda: open_engine(
                    spec.model, spec.device, kernels=spec.kernels, **({"num_blocks": spec.num_blocks} if spec.num_blocks else {})
                )
            )
            swarm = Swarm(
                engine,
                slots=spec.slots,
                policy=spec.policy,
                step_tokens=spec.step_tokens,
                shaping=spec.shaping,
                slack=spec.slack,
                prefix_cache=spec.prefix_cache,
                abandon_steps=spec.abandon_steps,
                speculate=spec.speculate,
                model_name=engine.model_name,
            )
        except Exception as exc:
            self._fail(exc)
            raise
        # The forwarders outlive the swarm: its shutdown ends every turn, and
        # those ends must still reach the driver before the stream closes.
        async with AsyncExitStack() as stack:
            self._tasks = await stack.enter_async_context(anyio.create_task_group())
            try:
                await stack.enter_async_context(swarm)  # (its draft model, if any, is opened here)
            except Exception as exc:
                self._fail(exc)
                raise
            self._swarm = swarm
            self._ready.set()
            await self._stop.wait()
        self._outbox.close()

    def _fail(self, exc: Exception) -> None:
        """The owner could not start: every call waiting for it says why, and
        no update will ever flow."""
        self._failure = f"{type(exc).__name__}: {exc}"
        self._outbox.close()
        self._updates.close()
        self._ready.set()

    async def info(self) -> OwnerInfo:
        await self._ready.wait()
        if self._failure:
            raise RuntimeError(f"owner {self.spec.name} could not start: {self._failure}")
        swarm = self._swarm
        started = swarm.bus.last_started
        return OwnerInfo(
            self.spec.name, swarm.engine.device_name, swarm.engine.model_name or "", os.getpid(), started.unix_time - started.t
        )

    async def start(self, turn_id: int, request: TurnRequest, lifts: dict[str, int]) -> None:
        """Run one turn here, under the lifts in force for it (an owner hears only
        its own agents' lifts, and this one may have just been placed here); its
        updates come back through `updates`."""
        await self._ready.wait()
        for key, priority in lifts.items():
            await self.lift(key, priority)  # into the mailbox ahead of the turn
        channel = await self._swarm.client.submit(turn_id, request, asked=request.t)  # the driver's ask, on our clock
        self._forwarding.add(turn_id)
        self._tasks.start_soon(self._forward, turn_id, channel)

    async def _forward(self, turn_id: int, channel: TurnChannel) -> None:
        try:
            async with channel.receive:
                async for update in channel.receive:
                    self._outbox.send_nowait((turn_id, update))
        finally:
            self._forwarding.discard(turn_id)

    async def updates(self) -> AsyncIterator[list[tuple[int, Any]]]:
        """Every turn's tokens and events, batched (one driver reads it). Ends
        after the owner stops and every turn's end is in it."""
        await self._ready.wait()
        finished = False
        try:
            async for batch in _batches(self._updates, lambda: _ready(self._updates)):
                yield batch
            finished = True
        finally:
            if not finished:  # the driver went away: nobody is left to read its turns
                with anyio.CancelScope(shield=True):
                    for turn_id in list(self._forwarding):
                        await self.cancel(turn_id, "its driver stopped listening")

    async def cancel(self, turn_id: int, reason: str) -> None:
        if self._swarm is not None:
            await self._swarm.client.cancel(turn_id, reason)

    async def lift(self, key: str, priority: int | None) -> None:
        await self._ready.wait()
        # Into the owner's mailbox, as the swarm's own lifts go.
        await self._swarm.system.tell(self._swarm.owner.name, SetInherited(lift=key, priority=priority))

    async def events(self) -> AsyncIterator[bytes]:
        """The owner's event stream as JSON-lines chunks (whatever has been
        emitted since the last chunk), from its start."""
        await self._ready.wait()
        bus = self._swarm.bus
        sub = bus.subscribe()
        yield encode(bus.last_started) + b"\n"
        async for batch in _batches(sub, sub.take_ready):
            yield b"".join(encode(item) + b"\n" for item in batch)

    async def steps(self) -> tuple[int, list[float]]:
        """Steps run so far, and the wall time of the latest ones (for benches)."""
        await self._ready.wait()
        owner = self._swarm.owner
        return owner.steps_run, list(owner.step_seconds)

    async def stop(self) -> None:
        self._stop.set()


async def _batches(source: AsyncIterator[T], ready: Callable[[], list[T]]) -> AsyncIterator[list[T]]:
    """At each wake-up, the item that woke it and whatever else is ready."""
    async for first in source:
        yield [first, *ready()]


def _ready(stream: Any) -> list[Any]:
    """What a memory object stream holds now, without waiting."""
    items = []
    while True:
        try:
            items.append(stream.receive_nowait())
        except (anyio.WouldBlock, anyio.EndOfStream):
            return items
