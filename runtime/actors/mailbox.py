"""What travels through an actor's mailbox, and how a message finds its handler.

A handler is an `async def` method marked with `@handler`; the type annotation
of its message parameter says which messages it takes:

    class Reviewer(Actor):
        @handler
        async def review(self, msg: Review) -> Verdict: ...
        @handler
        async def either(self, msg: Ping | Pong) -> None: ...   # a union takes both

Each Actor subclass builds its dispatch table once, when the class is created.
A message goes to the handler of its own type or, failing that, of its nearest
Struct base class (so a handler for `msgspec.Struct` catches everything).
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import msgspec

from runtime.errors import UsageError

F = TypeVar("F", bound=Callable[..., Any])

_MARK = "__slotswarm_handler__"


def handler(fn: F) -> F:
    """Mark an `async def method(self, msg: SomeStruct)` as a message handler.
    Its return value is the reply to an `ask`."""
    if not inspect.iscoroutinefunction(fn):
        raise UsageError(f"@handler {getattr(fn, '__qualname__', fn)!r} must be an async def method")
    setattr(fn, _MARK, True)
    return fn


def build_dispatch(cls: type) -> dict[type, str]:
    """Message type -> handler method name, over the whole MRO; a subclass's
    handler for a type replaces its base's. Method *names* are stored so that
    overriding a handler method (even undecorated) takes effect."""
    table: dict[type, str] = {}
    for klass in reversed(cls.__mro__):
        own: dict[type, str] = {}
        for attr, fn in vars(klass).items():
            if not getattr(fn, _MARK, False):
                continue
            for msg_type in _message_types(klass, attr, fn):
                if msg_type in own:
                    raise UsageError(f"{klass.__qualname__}: both {own[msg_type]}() and {attr}() handle {msg_type.__qualname__}")
                own[msg_type] = attr
        table.update(own)
    return table


def find_handler(table: dict[type, str], msg_type: type) -> str | None:
    for klass in msg_type.__mro__:
        name = table.get(klass)
        if name is not None:
            return name
    return None


def handled_names(table: dict[type, str]) -> str:
    names = sorted(t.__qualname__ for t in table)
    return ", ".join(names) if names else "nothing"


def _message_types(klass: type, attr: str, fn: Callable[..., Any]) -> list[type]:
    where = f"handler {klass.__qualname__}.{attr}()"
    params = list(inspect.signature(fn).parameters.values())
    if len(params) < 2:
        raise UsageError(f"{where} must take the message as its first argument after self")
    try:
        hints = typing.get_type_hints(fn)
    except NameError as exc:
        raise UsageError(
            f"{where}: cannot resolve its annotations ({exc}); define message types at module level, before the actor class"
        ) from None
    annotation = hints.get(params[1].name)
    if annotation is None:
        raise UsageError(f"{where} needs a type annotation on its message parameter {params[1].name!r}")
    members = typing.get_args(annotation) if _is_union(annotation) else (annotation,)
    for member in members:
        if not (isinstance(member, type) and issubclass(member, msgspec.Struct)):
            raise UsageError(f"{where}: messages must be msgspec.Struct types, got {member!r}")
    return list(members)


def _is_union(annotation: Any) -> bool:
    return isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union


class Reply:
    """The one-shot answer to an ask: a value or an error. The first outcome
    wins; anything after it (a late reply to a timed-out ask) is dropped."""

    __slots__ = ("done", "_value", "_error")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def succeed(self, value: Any) -> None:
        if not self.done.is_set():
            self._value = value
            self.done.set()

    def fail(self, error: BaseException) -> None:
        if not self.done.is_set():
            self._error = error
            self.done.set()

    def result(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value


class Envelope(typing.NamedTuple):
    """A message in a mailbox: `reply` is set for an ask, None for a tell."""

    msg: msgspec.Struct
    reply: Reply | None
    sender: str | None
