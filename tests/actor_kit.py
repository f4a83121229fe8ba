"""The actors and messages the actor system's tests share (their `bus` fixture is
conftest's)."""

from __future__ import annotations

import anyio
import msgspec

from runtime.actors.actor import Actor, handler
from runtime.events.bus import EventBus
from runtime.events.kinds import read_events
from runtime.scheduling.priority import BACKGROUND

GUARD = 10  # seconds: a hang guard, never a threshold


class Ping(msgspec.Struct, tag=True):
    n: int = 0


class Pong(msgspec.Struct, tag=True):
    n: int


class Boom(msgspec.Struct, tag=True):
    why: str = "boom"


class Never(msgspec.Struct, tag=True):
    pass


class Note(msgspec.Struct, tag=True):
    pass


class TellTwice(msgspec.Struct, tag=True):
    to: str


class Forward(msgspec.Struct, tag=True):
    to: str
    msg: Ping | Forward | TellTwice


class Echo(Actor):
    def __init__(self, name: str, priority: int = BACKGROUND, **kw) -> None:
        super().__init__(name, priority, **kw)
        self.seen: list[int] = []

    @handler
    async def ping(self, msg: Ping) -> Pong:
        self.seen.append(msg.n)
        return Pong(msg.n + 1)

    @handler
    async def boom(self, msg: Boom) -> None:
        raise ValueError(msg.why)


class Relay(Actor):
    """Asks whoever a Forward names, from inside a handler."""

    def __init__(self, name: str, priority: int = BACKGROUND, **kw) -> None:
        super().__init__(name, priority, **kw)
        self.entered = anyio.Event()
        self.release = anyio.Event()

    @handler
    async def forward(self, msg: Forward) -> object:
        return await self.ask(msg.to, msg.msg, timeout=GUARD)

    @handler
    async def ping(self, msg: Ping) -> Pong:
        self.entered.set()
        await self.release.wait()
        return Pong(msg.n)


class Teller(Relay):
    notes = 0

    @handler
    async def tell_twice(self, msg: TellTwice) -> None:
        await self.tell(msg.to, Note())
        await self.tell(msg.to, Note())

    @handler
    async def note(self, msg: Note) -> None:
        self.notes += 1


class Silent(Actor):
    @handler
    async def never(self, msg: Never) -> None:
        await anyio.sleep_forever()


def events(bus: EventBus, kind: type) -> list:
    """Every event of that name emitted so far, from the bus's JSON-lines log."""
    return [e for e in read_events(bus.log_path) if isinstance(e, kind)]
