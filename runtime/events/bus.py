"""The event bus: fans each event out to the log sinks and the live viewers.

Sinks: JSON lines to a file (`runtime.events.kinds.encode`, the same bytes a live
socket sends), readable lines on a terminal (through structlog), and in-process
subscribers for live viewers. A subscriber has a bounded buffer; when it falls
behind it loses the newest events and is told how many, so a slow viewer can
never slow the decode loop.
"""

from __future__ import annotations

import collections
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import anyio
import msgspec
import structlog

from runtime.errors import UsageError
from runtime.events.files import open_private
from runtime.events.kinds import Dropped, Event, SwarmStarted, encode


class Subscription:
    """A bounded, lossy queue of events for one live viewer. Iterate it with
    `async for item in sub`; items are Events, and where events were lost a
    Dropped notice, in the place of the gap."""

    def __init__(self, bus: EventBus, max_buffer: int) -> None:
        self._bus = bus
        self._buffer: collections.deque[Event | Dropped] = collections.deque()
        self._events = 0  # Events in the buffer (Dropped markers take no room)
        self._max = max_buffer
        self._wakeup = anyio.Event()
        self.closed = False

    def put(self, event: Event) -> None:
        if self._events < self._max:
            self._buffer.append(event)
            self._events += 1
        elif self._buffer and isinstance(self._buffer[-1], Dropped):
            self._buffer[-1].count += 1
        else:
            self._buffer.append(Dropped(1))
        self._wakeup.set()

    def pending(self) -> int:
        """Events not yet taken out: those buffered and those already lost."""
        return self._events + sum(item.count for item in self._buffer if isinstance(item, Dropped))

    def take_ready(self) -> list[Event | Dropped]:
        """Everything buffered now, without waiting (a viewer that sends in batches)."""
        items = list(self._buffer)
        self._buffer.clear()
        self._events = 0
        return items

    def close(self) -> None:
        self.closed = True
        self._bus._subscribers.discard(self)
        self._wakeup.set()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Event | Dropped:
        while not self._buffer:
            if self.closed:
                raise StopAsyncIteration
            self._wakeup = anyio.Event()
            await self._wakeup.wait()
        item = self._buffer.popleft()
        if not isinstance(item, Dropped):
            self._events -= 1
        return item


class EventBus:
    """Fans each event out to the log sinks and the live subscribers. `emit` is
    synchronous and never blocks, so the owner loop can call it between steps."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._start = time.monotonic()
        self._clock = clock or (lambda: time.monotonic() - self._start)
        self._subscribers: set[Subscription] = set()
        # Called before each event reaches the subscribers: a way to subscribe
        # whoever must not miss it (runtime.events.stream's viewers waiting on accept).
        self.before_fanout: list[Callable[[], None]] = []
        self._loggers: list[structlog.typing.FilteringBoundLogger] = []  # readable lines
        self._files: list[IO[bytes]] = []  # JSON lines
        self.counts: collections.Counter[type[Event]] = collections.Counter()  # by kind
        self.last_started: SwarmStarted | None = None  # replayed to viewers that attach late

    def now(self) -> float:
        return self._clock()

    def emit(self, event: Event) -> None:
        self.counts[type(event)] += 1
        if isinstance(event, SwarmStarted):
            self.last_started = event
        if self._files:
            line = encode(event) + b"\n"
            for f in self._files:
                f.write(line)
        if self._loggers:
            fields = {k: v for k, v in msgspec.structs.asdict(event).items() if v is not None}
            for logger in self._loggers:
                logger.info(event.event, **fields)
        for admit in tuple(self.before_fanout):
            admit()  # (the live stream takes in viewers that connected just now)
        for sub in tuple(self._subscribers):
            sub.put(event)

    def subscribe(self, max_buffer: int = 10_000) -> Subscription:
        """A live queue of the events from now on, holding at most `max_buffer`
        of them (older ones are dropped, and say so)."""
        if isinstance(max_buffer, bool) or not isinstance(max_buffer, int) or max_buffer < 1:
            raise UsageError(f"max_buffer must be an int of at least 1, got {max_buffer!r}")
        sub = Subscription(self, max_buffer)
        self._subscribers.add(sub)
        return sub

    def log_to_file(self, path: str | Path) -> Path:
        """Append every event to `path` as one JSON object a line."""
        path = Path(path)
        # Unbuffered: a line is in the file the moment it is emitted, for `tail -f`.
        # Private (0600): prompts and agent names are the user's business.
        self._files.append(open_private(path, "ab", buffering=0))
        return path

    def log_to_terminal(self, file: IO[str] | None = None, colors: bool | None = None) -> None:
        """Readable lines, for a person watching the swarm."""
        out = file or sys.stderr
        self._loggers.append(
            structlog.wrap_logger(
                structlog.WriteLogger(out),
                processors=[
                    _drop_method_name,
                    _format_time,
                    structlog.dev.ConsoleRenderer(
                        colors=out.isatty() if colors is None else colors,
                        sort_keys=False,
                        pad_event_to=18,
                    ),
                ],
            )
        )

    def close(self) -> None:
        for sub in tuple(self._subscribers):
            sub.close()
        for f in self._files:
            f.close()
        self._files.clear()
        self._loggers.clear()


def _drop_method_name(logger: object, method: str, event_dict: dict) -> dict:
    return event_dict


def _format_time(logger: object, method: str, event_dict: dict) -> dict:
    event_dict["t"] = f"{event_dict['t']:9.3f}s"
    return event_dict
