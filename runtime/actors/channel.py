"""A turn's update channel: one sender (the GPU owner), one receiver (the turn's
handle), unbounded, in order.

It is the anyio memory object stream's interface cut down to what a turn needs,
because that stream's price is paid once per token per agent: every `receive`
takes a trip through the event loop before it looks, then makes an Event, looks
up the current task and registers a waiter, and every `send_nowait` asks that
task whether it is being cancelled. At 64 slots that was most of the owner's
host work per step. Here a send appends to a deque and wakes the receiver only if
it is waiting, so what a step sends a turn (its token, its events) costs the
receiving task one wake-up, and the receiver takes what is there without one.
(The owner sends each turn one token a step, so a batch per step would be a
message per token still: the wake-up is what costs.)

Errors are anyio's, as the memory stream raises them: a send after the receiver
closed is BrokenResourceError, a receive after the sender closed and the
buffer drained is EndOfStream, and either side's use after its own close is
ClosedResourceError. A receiver waiting when the sender closes wakes up.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Generator
from typing import Any, Generic, Self, TypeVar

import anyio
from anyio.abc import ObjectReceiveStream, ObjectSendStream

T = TypeVar("T")

EMPTY: Any = object()  # what `take` returns when nothing is there


class _State(Generic[T]):
    __slots__ = ("items", "waiter", "send_closed", "receive_closed", "new_waiter", "futures")

    def __init__(self) -> None:
        self.items: collections.deque[T] = collections.deque()
        self.waiter: Any = None  # what the receiver waits on, while it waits
        self.send_closed = False
        self.receive_closed = False
        # How the receiver waits, found at its first wait (the receiver makes a
        # waiter per wait, and anyio.Event() asks which async library runs every
        # time): on asyncio a bare future of the running loop, as asyncio.Event
        # would make, without the Event around it; elsewhere anyio's Event.
        self.new_waiter: Any = None
        self.futures = False

    def wake(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is None:
            return
        if not self.futures:
            waiter.set()
        elif not waiter.done():  # (done: cancelled, its receiver gone)
            waiter.set_result(None)

    def wait(self) -> Awaitable[None]:
        """What the receiver awaits until the sender wakes it. On asyncio that is
        the bare future the sender sets, awaited as it is: a wait per token
        costs no coroutine of its own. (If the receiver is cancelled, the future
        is cancelled with it, and `wake` passes it over.)"""
        if self.new_waiter is None:
            try:
                self.new_waiter, self.futures = asyncio.get_running_loop().create_future, True
            except RuntimeError:  # another anyio backend
                self.new_waiter = type(anyio.Event())
        self.waiter = waiter = self.new_waiter()
        return waiter if self.futures else self._wait_event(waiter)

    async def _wait_event(self, waiter: anyio.Event) -> None:
        try:
            await waiter.wait()
        finally:
            if self.waiter is waiter:  # cancelled while waiting
                self.waiter = None


class _Ready:
    """An awaitable that is done already (awaiting it does not suspend)."""

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield


READY = _Ready()


class _Closes:
    """`with` and `aclose` close an end, as they do a memory stream's."""

    def close(self) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        self.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class UpdateSender(_Closes, ObjectSendStream[T]):
    def __init__(self, state: _State[T]) -> None:
        self._state = state

    def send_nowait(self, item: T) -> None:
        state = self._state
        if state.send_closed:
            raise anyio.ClosedResourceError
        if state.receive_closed:
            raise anyio.BrokenResourceError
        state.items.append(item)
        if state.waiter is not None:
            state.wake()

    async def send(self, item: T) -> None:
        await anyio.lowlevel.checkpoint()
        self.send_nowait(item)

    def close(self) -> None:
        self._state.send_closed = True
        self._state.wake()


class UpdateReceiver(_Closes, ObjectReceiveStream[T]):
    def __init__(self, state: _State[T]) -> None:
        self._state = state

    def take(self) -> T:
        """The next item, or EMPTY if none has come yet: receive_nowait without
        an exception for the common case of a turn between two tokens."""
        state = self._state
        if state.items and not state.receive_closed:
            return state.items.popleft()
        if state.receive_closed:
            raise anyio.ClosedResourceError
        if state.send_closed:
            raise anyio.EndOfStream
        return EMPTY

    def receive_nowait(self) -> T:
        item = self.take()
        if item is EMPTY:
            raise anyio.WouldBlock
        return item

    def wait(self) -> Awaitable[None]:
        """Await it: until an item is there or either end is closed (take() says
        which). Not a coroutine (_State.wait says why)."""
        state = self._state
        if state.items or state.send_closed or state.receive_closed:
            return READY
        return state.wait()

    async def receive(self) -> T:
        """The next item, waiting for it if none is there. (What is already there
        is taken without a checkpoint, as receive_nowait would.)"""
        while (item := self.take()) is EMPTY:
            await self._state.wait()
        return item

    def close(self) -> None:
        self._state.receive_closed = True
        self._state.items.clear()


def open_channel() -> tuple[UpdateSender[Any], UpdateReceiver[Any]]:
    state: _State[Any] = _State()
    return UpdateSender(state), UpdateReceiver(state)
