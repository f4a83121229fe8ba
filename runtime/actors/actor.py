"""Actors: named objects with a mailbox, talking only by messages.

    class Echo(Actor):
        @handler
        async def echo(self, msg: Say) -> Said:
            return Said(msg.text)

    async with ActorSystem(bus) as system:          # runtime.actors.system
        ref = await system.spawn(Echo("echo"))
        said = await ref.ask(Say("hi"), timeout=5)

Semantics, in full:

- Messages are msgspec Structs. A handler (see `runtime.actors.mailbox.handler`) is
  chosen by the message's type; what it returns is the reply to an `ask`.
- One message at a time per actor, in mailbox order. A handler that awaits an
  `ask` holds up its own mailbox until the reply comes. Instead of deadlocking,
  every ask records a wait sender -> target in `system.waits` while it is in
  flight (the target inherits the sender's priority), and an ask that would close
  a cycle of waits (B, transitively, is asking A while A asks B; or A asks
  itself) raises WaitCycle at once. So does a `tell` that has to wait for room
  in a full mailbox (give actors that must always accept `mailbox_size=math.inf`).
- An actor may define `async def run(self)`, a background loop (an agent's main
  loop) running alongside its mailbox: it may ask others while the actor keeps
  answering messages. The wait graph knows actors, not tasks, so a cycle through
  an actor's run() and its handlers is refused too, although it would not hang.
  run() returning normally leaves the actor serving its mailbox.
- An exception escaping a handler is the reply: the asker's `ask` raises it and
  the actor carries on. For a `tell` there is no one to raise to, so it is
  logged (logger "runtime.actors.system"), as is a told message nobody handles.
- An exception from on_start() or run() kills the actor, and only it: the
  `agent.crashed` event is emitted, asks in flight to it and every later ask or
  tell raise ActorCrashed naming it, its on_stop() runs and the
  `system.on_actor_stopped` hooks are called. Messages still in its mailbox are
  dropped (asks among them get ActorCrashed).
- `system.stop(name)` and leaving `async with ActorSystem(...)` cancel actors
  the same way (asks in flight get ActorCrashed "stopped"), then run on_stop()
  (shielded, bounded by `stop_timeout`) and the hooks. Don't stop an actor from
  its own on_stop().
- `ask` without a timeout waits as long as it takes; with one it raises
  AskTimeout and a late reply is dropped (the message itself is still handled).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Union

import msgspec

from runtime.actors.mailbox import build_dispatch, handler
from runtime.errors import ActorError, UsageError
from runtime.scheduling.priority import BACKGROUND

if TYPE_CHECKING:
    from runtime.actors.system import ActorSystem

__all__ = ["Actor", "Ref", "Target", "handler"]

Target = Union[str, "Actor", "Ref"]


def check_priority(name: str, priority: object) -> None:
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise UsageError(f"priority of actor {name!r} must be an int, got {priority!r}")


class Actor:
    """Subclass it, add `@handler` methods, optionally on_start/on_stop/run.
    `name` is unique in the system; `priority` is the base priority the wait
    graph starts from (changing it later updates the graph)."""

    # Messages that may wait in the mailbox; a full one makes `tell` wait. Use
    # math.inf where a sender (the GPU owner's loop) must never block on this actor.
    mailbox_size: ClassVar[float] = 64
    _dispatch: ClassVar[dict[type, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._dispatch = build_dispatch(cls)

    def __init__(self, name: str, priority: int = BACKGROUND, *, mailbox_size: float | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise UsageError(f"an actor needs a non-empty name, got {name!r}")
        check_priority(name, priority)
        size = type(self).mailbox_size if mailbox_size is None else mailbox_size
        if size < 1:
            raise UsageError(f"mailbox_size of actor {name!r} must be at least 1, got {size}")
        self.name = name
        self.mailbox_size = size
        self._priority = priority
        self._system: ActorSystem | None = None

    @property
    def system(self) -> ActorSystem:
        if self._system is None:
            raise ActorError(f"actor {self.name!r} is not spawned in an ActorSystem")
        return self._system

    @property
    def ref(self) -> Ref:
        return Ref(self.name, self.system)

    @property
    def priority(self) -> int:
        return self._priority

    @priority.setter
    def priority(self, value: int) -> None:
        check_priority(self.name, value)  # before anything changes: a bad value is refused whole
        self._priority = value
        if self._system is not None:
            self._system.waits.set_base(self.name, value)

    @property
    def effective_priority(self) -> int:
        """Base priority, or higher while someone waiting on this actor lends it theirs."""
        return self.system.waits.effective(self.name) if self._system else self._priority

    async def on_start(self) -> None:
        """Runs before the first message; an exception here kills the actor."""

    async def on_stop(self) -> None:
        """Runs once when the actor stops for any reason, even a failed on_start."""

    def on_undelivered(self, msg: msgspec.Struct) -> bool:
        """Told, before on_stop, of each message still in the mailbox when the
        actor stopped; True if it took care of it (the default: it is dropped,
        with a warning)."""
        return False

    async def tell(self, target: Target, msg: msgspec.Struct) -> None:
        await self.system.tell(target, msg, sender=self.name)

    async def ask(self, target: Target, msg: msgspec.Struct, *, timeout: float | None = None) -> Any:
        return await self.system.ask(target, msg, timeout=timeout, sender=self.name)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {getattr(self, 'name', '(unnamed)')!r}>"


class Ref:
    """A handle on an actor by name, for code outside any actor (tests, CLI).
    Pass `sender=` to have the wait graph see who is waiting."""

    __slots__ = ("name", "system")

    def __init__(self, name: str, system: ActorSystem) -> None:
        self.name = name
        self.system = system

    @property
    def alive(self) -> bool:
        return self.system.is_alive(self.name)

    async def tell(self, msg: msgspec.Struct, *, sender: str | None = None) -> None:
        await self.system.tell(self.name, msg, sender=sender)

    async def ask(self, msg: msgspec.Struct, *, timeout: float | None = None, sender: str | None = None) -> Any:
        return await self.system.ask(self.name, msg, timeout=timeout, sender=sender)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Ref) and (other.name, other.system) == (self.name, self.system)

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"<Ref {self.name!r}>"


def __getattr__(name: str) -> Any:
    # `from runtime.actors.actor import ActorSystem` keeps working although the system
    # lives in runtime.actors.system (which imports this module, hence the late import).
    if name == "ActorSystem":
        from runtime.actors.system import ActorSystem

        return ActorSystem
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
