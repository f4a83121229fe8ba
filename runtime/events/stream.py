"""The live event stream: the swarm's EventBus, served on a Unix socket.

`swarm tail` (or any program) connects to the socket and reads JSON lines, one per
event, in the schema of `runtime.events.kinds`. When a viewer falls behind it loses
events and is sent `{"event": "events.dropped", "count": N}` in their place
(`runtime.events.kinds.Dropped`).

The swarm runner starts the server inside its task group:

    path = await tg.start(serve_events, bus, default_socket_path())

It stops when it is cancelled or when the bus is closed, and removes the socket
either way. Viewers can never disturb the swarm: each one has its own task and its
own bounded, lossy subscription, a viewer that stops reading only loses events,
and whatever goes wrong with one viewer is logged and ends that viewer alone.

The socket is chmod 0600 inside a 0700 directory: only the local user can watch.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.abc

from runtime.errors import ConfigError
from runtime.events.bus import EventBus, Subscription
from runtime.events.kinds import Dropped, Event, encode
from runtime.events.sockets import default_socket_dir, default_socket_path, live_sockets, prepare_socket_path

# (where sockets live is runtime.events.sockets; its public names are served from here too)
__all__ = [
    "CLIENT_BUFFER",
    "RoomWaits",
    "default_socket_dir",
    "default_socket_path",
    "encode_line",
    "live_sockets",
    "serve_events",
]

log = logging.getLogger("slotswarm.stream")

# Events a viewer may fall behind by before it starts losing them. A few hundred
# bytes each, so this bounds a stuck viewer's cost to well under a megabyte.
CLIENT_BUFFER = 2_000

# How long viewers get to read what is still buffered for them once the bus closes.
SHUTDOWN_GRACE_S = 1.0

# A viewer that hung up, reset the connection or was closed under us: not an error.
_CLIENT_GONE = (
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
    ConnectionError,
)


@dataclass
class RoomWaits:
    """How the viewers of one server wait for room in their sockets. A viewer that
    stops reading must cost the swarm nothing: it waits without being woken until
    it reads again, so `wakeups` stays still however long it is stuck."""

    waiting: int = 0  # viewers waiting for room now
    wakeups: int = 0  # times a waiting viewer was woken to look again


def encode_line(item: Event | Dropped) -> bytes:
    """One item of a subscription as one line of the stream."""
    return encode(item) + b"\n"


# ---------------------------------------------------------------- the server


async def serve_events(
    bus: EventBus,
    path: str | os.PathLike[str],
    *,
    max_buffer: int = CLIENT_BUFFER,
    grace_s: float = SHUTDOWN_GRACE_S,
    waits: RoomWaits | None = None,
    task_status: anyio.abc.TaskStatus[Path] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `bus` on a Unix socket at `path` until cancelled or until the bus is
    closed. `task_status.started` reports the path once clients can connect.
    `waits`, if given, counts how the viewers wait for room in their sockets."""
    path = Path(path)
    prepare_socket_path(path)
    closing = _CloseWatch(bus)
    waits = waits if waits is not None else RoomWaits()
    try:
        listener = await anyio.create_unix_listener(path, mode=0o600)
    except OSError as exc:
        closing.close()
        raise ConfigError(f"cannot listen on {path}: {exc}") from exc
    inode = path.stat().st_ino
    raw = listener.extra(anyio.abc.SocketAttribute.raw_socket)
    try:
        async with listener, anyio.create_task_group() as clients:
            accepting = anyio.CancelScope()
            clients.start_soon(_accept_clients, listener, bus, max_buffer, waits, clients, accepting)
            # A viewer's connect completes in the kernel before accept() runs; events
            # emitted in between would be lost to it. So before each event goes out,
            # take in (and subscribe) every viewer already connected.

            def admit_connected() -> None:
                while True:
                    try:
                        conn, _ = raw.accept()
                    except (BlockingIOError, InterruptedError):
                        return
                    except OSError as exc:
                        log.warning("event stream: accept failed: %s", exc)
                        return
                    clients.start_soon(_adopt, conn, bus.subscribe(max_buffer), bus.last_started, waits)

            bus.before_fanout.append(admit_connected)
            task_status.started(path)
            await closing.wait()
            bus.before_fanout.remove(admit_connected)
            # The swarm is done: no new viewers, and the current ones get a moment
            # to read what is still buffered for them (their subscriptions are
            # closed, so their tasks end once drained).
            accepting.cancel()
            clients.cancel_scope.deadline = anyio.current_time() + grace_s
    finally:
        closing.close()
        _remove_socket(path, inode)


async def _accept_clients(
    listener: anyio.abc.SocketListener,
    bus: EventBus,
    max_buffer: int,
    waits: RoomWaits,
    clients: anyio.abc.TaskGroup,
    scope: anyio.CancelScope,
) -> None:
    with scope:
        while True:
            try:
                stream = await listener.accept()
            except anyio.ClosedResourceError:
                return
            except OSError as exc:
                # Out of file descriptors, say: the swarm must go on; try again soon.
                log.warning("event stream: accept failed: %s", exc)
                await anyio.sleep(0.1)
                continue
            # Subscribe here, synchronously, so the viewer misses nothing emitted
            # from the moment it connected; a viewer that attaches late still
            # learns the slots, policy and model from the replayed swarm.started.
            sub = bus.subscribe(max_buffer)
            clients.start_soon(_serve_client, stream, sub, bus.last_started, waits)


async def _adopt(conn: socket.socket, sub: Subscription, started: Event | None, waits: RoomWaits) -> None:
    try:
        stream = await anyio.abc.UNIXSocketStream.from_socket(conn)
    except BaseException:
        conn.close()
        sub.close()
        raise
    await _serve_client(stream, sub, started, waits)


async def _serve_client(stream: anyio.abc.SocketStream, sub: Subscription, started: Event | None, waits: RoomWaits) -> None:
    room = _Room(stream.extra(anyio.abc.SocketAttribute.raw_socket), waits)
    try:
        async with stream, anyio.create_task_group() as tg:
            tg.start_soon(_hang_up_on_eof, stream, tg.cancel_scope)
            if started is not None:
                await stream.send(encode_line(started))
            taken = 0  # an item taken from the subscription but not yet sent
            try:
                async for item in sub:
                    taken = item.count if isinstance(item, Dropped) else 1
                    line = encode_line(item)
                    # A viewer that stops reading holds us here, never the bus: its
                    # subscription fills up and then counts what it lost. A line is
                    # only sent once the socket has room for all of it, so it is never
                    # cut in half, and room for one more line is always kept...
                    await room.wait_for(len(line))
                    await stream.send(line)
                    taken = 0
            except anyio.get_cancelled_exc_class():
                # ...for this: the swarm stopped and the viewer's grace ran out. It is
                # told what it never got before the stream closes.
                lost = taken + sub.pending()
                if lost:
                    with anyio.CancelScope(shield=True), anyio.move_on_after(0.5):
                        await stream.send(encode_line(Dropped(lost)))
                raise
            tg.cancel_scope.cancel()
    except* _CLIENT_GONE:
        log.debug("event stream: viewer went away")
    except* Exception as group:
        log.warning("event stream: viewer dropped after an error", exc_info=group)
    finally:
        sub.close()


class _Room:
    """Room in a Unix socket's send buffer, kept so that a last, short line always
    fits. Linux tells how much of the buffer is in use (SIOCOUTQ); elsewhere the
    check is skipped and a send simply waits.

    A viewer short of room sleeps until the kernel calls its socket writable, which
    for a Unix socket means at most a quarter of the buffer is still unread: a
    viewer that stops reading is never woken, whatever the swarm emits meanwhile."""

    RESERVE = 4096  # bytes of buffer kept free: one Dropped line with its overhead

    def __init__(self, sock: socket.socket, waits: RoomWaits) -> None:
        self.sock = sock
        self.waits = waits
        try:
            self.size = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
            self._used()
        except (OSError, AttributeError):
            self.size = None

    def _used(self) -> int:
        import fcntl
        import struct
        import termios

        return struct.unpack("i", fcntl.ioctl(self.sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]

    async def wait_for(self, n: int) -> None:
        if self.size is None:
            return
        # Each queued line costs its length and about a kilobyte of bookkeeping.
        if self._used() + n + 1024 + self.RESERVE <= self.size:
            return
        if self._used() * 4 > self.size:  # not writable: sleep until the viewer reads
            self.waits.waiting += 1
            try:
                await anyio.wait_writable(self.sock)
            finally:
                self.waits.waiting -= 1
            self.waits.wakeups += 1
        # Writable: three quarters of the buffer are free, room for any line but
        # one longer than most of it, which goes out as the send finds room.


async def _hang_up_on_eof(stream: anyio.abc.SocketStream, scope: anyio.CancelScope) -> None:
    # Viewers send nothing; reading only tells us promptly that one went away,
    # so its subscription is released even while the swarm is quiet. (It waits
    # with anyio.wait_readable, not stream.receive: on asyncio, a receive
    # cancelled just as the viewer hangs up sets a cancelled future's result, an
    # error in the event loop.)
    sock = stream.extra(anyio.abc.SocketAttribute.raw_socket)
    try:
        while True:
            await anyio.wait_readable(sock)
            try:
                if not sock.recv(4096):
                    break  # the viewer hung up
            except BlockingIOError:
                continue
    except (*_CLIENT_GONE, OSError):
        pass
    scope.cancel()


def _remove_socket(path: Path, inode: int) -> None:
    # Only our own socket: another swarm may have taken the path since.
    try:
        if path.stat().st_ino == inode:
            path.unlink()
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            log.warning("event stream: cannot remove %s: %s", path, exc)


class _CloseWatch(Subscription):
    """A subscription that keeps no events and wakes no one: it only tells
    `serve_events` when the bus closes (EventBus.close closes every subscriber).
    EventBus.subscribe makes plain Subscriptions, so this registers itself."""

    def __init__(self, bus: EventBus) -> None:
        super().__init__(bus, max_buffer=0)
        bus._subscribers.add(self)

    def put(self, event: Event) -> None:
        pass  # called inside bus.emit: nothing to keep

    async def wait(self) -> None:
        # put() never buffers, so iteration only ends, when the bus closes us.
        async for _ in self:
            pass
