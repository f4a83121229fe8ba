"""Where a hub's events come from: a swarm in this process (its EventBus), a
running swarm's Unix socket, or a recorded events file."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream

from runtime.events.bus import EventBus
from runtime.events.stream import default_socket_dir, encode_line, live_sockets
from swarm.viewers.tail import read_file
from swarm.viewers.watch.hub import WatchHub

log = logging.getLogger("slotswarm.watch")

POLL_S = 0.2  # how often to look for a swarm that is not there (yet)
MAX_LINE = 1 << 20


async def follow_bus(hub: WatchHub, bus: EventBus, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    """Feed `hub` from an in-process bus until the bus closes. Start it with
    `tg.start` before the swarm starts, and the pages miss nothing."""
    sub = bus.subscribe()
    if bus.last_started is not None:  # attached to a swarm already running
        hub.publish(encode_line(bus.last_started))
    hub.set_status("live", live=True)
    task_status.started()
    try:
        async for item in sub:
            hub.publish(encode_line(item))
    finally:
        sub.close()
        hub.set_status("the swarm stopped", live=False)


async def follow_socket(hub: WatchHub, path: str | os.PathLike[str] | None = None) -> None:
    """Follow the swarm serving events at `path` (None: the newest running swarm),
    forever: wait for it if it is not there yet, and for the next one once it stops."""
    where = os.fspath(path) if path is not None else f"{default_socket_dir()}/*.sock"
    while True:
        target = Path(path) if path is not None else next(iter(live_sockets()), None)
        try:
            if target is None:
                raise OSError("no live socket")
            stream = await anyio.connect_unix(target)
        except OSError:
            if hub.status["live"] or not hub.history:
                hub.set_status(f"waiting for a swarm at {where}", live=False)
            await anyio.sleep(POLL_S)
            continue
        hub.set_status(f"live: {target}", live=True)
        try:
            async with stream:
                lines = BufferedByteReceiveStream(stream)
                while True:
                    hub.publish(await lines.receive_until(b"\n", MAX_LINE))
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError, OSError):
            pass
        except anyio.DelimiterNotFound:
            log.warning("watch: a line over %d bytes from %s; reconnecting", MAX_LINE, target)
        hub.set_status(f"the swarm at {target} stopped; waiting for the next one at {where}", live=False)
        await anyio.sleep(POLL_S)


def load_file(hub: WatchHub, path: str | os.PathLike[str]) -> int:
    """Put a recorded session into `hub` for replay; returns how many events.
    A line that is not an event is a ConfigError naming it, before anything is served."""
    count = 0
    for raw, _ in read_file(path):
        hub.publish(raw)
        count += 1
    hub.set_status(f"recording: {os.fspath(path)} ({count} events)", live=False)
    return count
