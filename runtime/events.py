"""The live event stream: every scheduling decision as one structured record.

Schema (stable; new optional fields may be added, none removed or renamed). Every
event has `event` (its name), `t` (seconds since the swarm started, virtual in the
simulator) and `step` (the decode step it was decided at). The rest is set where it
means something:

| event               | what happened                          | fields beyond event, t, step              |
|---------------------|----------------------------------------|-------------------------------------------|
| swarm.started       | the swarm is up                        | unix_time, slots, policy, device, model   |
| swarm.stopped       | the swarm is down                      | unix_time                                 |
| turn.queued         | an agent asked for a turn (t: when)    | turn, agent, priority, tokens (prompt)    |
| turn.admitted       | it got a slot for the first time       | turn, agent, priority, slot, waited_s     |
| turn.preempted      | paused at a token boundary             | turn, agent, priority, slot, tokens,      |
|                     |                                        | by_turn, by_agent, by_priority            |
| turn.resumed        | back in a slot after a pause           | turn, agent, priority, slot, paused_s     |
| turn.finished       | ended normally (eos or max tokens)     | turn, agent, priority, slot, tokens,      |
|                     |                                        | reason ("eos" or "length")                |
| turn.cancelled      | ended by its agent or the swarm        | turn, agent, priority, slot, tokens, reason|
| turn.failed         | ended by an error                      | turn, agent, priority, slot, tokens, reason|
| priority.inherited  | an agent runs at a waiter's priority   | agent, priority, base_priority, by_agent  |
| priority.restored   | the wait ended, the priority drops back| agent, priority, base_priority            |
| kv.swapped_out      | a turn's KV moved to host memory       | turn, agent, priority, blocks             |
| kv.swapped_in       | and back to the device                 | turn, agent, priority, slot, blocks       |
| kv.recomputed       | its KV was dropped and is re-prefilled | turn, agent, priority, slot, tokens       |
| agent.crashed       | an actor died; the swarm goes on       | agent, reason                             |

`priority` is always the *effective* priority (base, aged, or inherited) at the time
of the event. `slot` is absent while a turn holds none.

Sinks: JSON lines to a file, readable lines on a terminal (both through structlog),
and in-process subscribers for live viewers. A subscriber has a bounded buffer; when
it falls behind it loses the newest events and is told how many, so a slow viewer
can never slow the decode loop.
"""

from __future__ import annotations

import collections
import sys
import time
from pathlib import Path
from typing import IO, Callable, Iterator

import anyio
import msgspec
import structlog


class Event(msgspec.Struct, kw_only=True, omit_defaults=True):
    event: str
    t: float
    step: int
    turn: int | None = None
    agent: str | None = None
    priority: int | None = None
    slot: int | None = None
    tokens: int | None = None
    by_turn: int | None = None
    by_agent: str | None = None
    by_priority: int | None = None
    base_priority: int | None = None
    waited_s: float | None = None
    paused_s: float | None = None
    blocks: int | None = None
    reason: str | None = None
    unix_time: float | None = None
    slots: int | None = None
    policy: str | None = None
    device: str | None = None
    model: str | None = None


class Dropped(msgspec.Struct):
    """Told to a subscriber in place of the events it lost by falling behind."""

    count: int


TERMINAL = frozenset({"turn.finished", "turn.cancelled", "turn.failed"})

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Event)


def encode(event: Event) -> bytes:
    return _encoder.encode(event)


def decode(line: bytes | str) -> Event:
    return _decoder.decode(line)


def read_events(path: str | Path) -> Iterator[Event]:
    """Every event in a JSON-lines file, in order."""
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                yield decode(line)


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
        if isinstance(item, Event):
            self._events -= 1
        return item


class EventBus:
    """Fans each event out to the log sinks and the live subscribers. `emit` is
    synchronous and never blocks, so the owner loop can call it between steps."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._start = time.monotonic()
        self._clock = clock or (lambda: time.monotonic() - self._start)
        self._subscribers: set[Subscription] = set()
        self._loggers: list[structlog.typing.FilteringBoundLogger] = []
        self._files: list[IO[str]] = []
        self.counts: collections.Counter[str] = collections.Counter()
        self.last_started: Event | None = None  # replayed to viewers that attach late

    def now(self) -> float:
        return self._clock()

    def emit(self, event: Event) -> None:
        self.counts[event.event] += 1
        if event.event == "swarm.started":
            self.last_started = event
        if self._loggers:
            fields = {k: v for k, v in msgspec.structs.asdict(event).items() if v is not None}
            name = fields.pop("event")
            for logger in self._loggers:
                logger.info(name, **fields)
        for sub in tuple(self._subscribers):
            sub.put(event)

    def subscribe(self, max_buffer: int = 10_000) -> Subscription:
        sub = Subscription(self, max_buffer)
        self._subscribers.add(sub)
        return sub

    def log_to_file(self, path: str | Path) -> Path:
        """Append every event to `path` as one JSON object a line."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "a", buffering=1, encoding="utf-8")
        self._files.append(f)
        self._loggers.append(
            structlog.wrap_logger(
                structlog.WriteLogger(f),
                processors=[_drop_method_name, _to_json],
            )
        )
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


def _to_json(logger: object, method: str, event_dict: dict) -> str:
    # The structlog event key is the event name; the file keeps our schema's name.
    event_dict = {"event": event_dict.pop("event"), **event_dict}
    return _encoder.encode(event_dict).decode()


def _format_time(logger: object, method: str, event_dict: dict) -> dict:
    event_dict["t"] = f"{event_dict['t']:9.3f}s"
    return event_dict
