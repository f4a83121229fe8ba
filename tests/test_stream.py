"""The live event socket: viewers get every event, a stuck or vanishing viewer
never disturbs the bus, the socket is private and cleaned up."""

from __future__ import annotations

import os
import socket
import stat
from functools import partial
from pathlib import Path

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from fake_session import Clock, emit_session

from runtime.events.bus import EventBus
from runtime.events.kinds import Dropped, Event, Queued, SwarmStarted, SwarmStopped
from runtime.events.stream import RoomWaits, serve_events
from swarm.viewers import tail

STARTED = SwarmStarted(t=0.0, step=0, unix_time=1.7e9, slots=4, policy="preempt")


class Viewer:
    """A test client reading the stream line by line."""

    def __init__(self, stream: anyio.abc.SocketStream) -> None:
        self.stream = stream
        self.reader = BufferedByteReceiveStream(stream)

    @classmethod
    async def connect(cls, path: Path) -> Viewer:
        return cls(await anyio.connect_unix(path))

    async def read(self) -> Event | Dropped | None:
        """The next item, or None at the end of the stream."""
        try:
            line = await self.reader.receive_until(b"\n", 1 << 20)
        except anyio.IncompleteRead:
            return None
        return tail.parse_line(line, "stream")

    async def read_all(self) -> list[Event | Dropped]:
        items = []
        while (item := await self.read()) is not None:
            items.append(item)
        return items


async def attach(bus: EventBus, path: Path) -> Viewer:
    """Connect and wait until the server has subscribed us, which it proves by
    replaying the swarm.started event."""
    viewer = await Viewer.connect(path)
    with anyio.fail_after(30):  # a hang guard, not a speed check
        assert await viewer.read() == STARTED
    return viewer


@pytest.mark.anyio
async def test_a_viewer_receives_the_session_exactly(sock_path: Path) -> None:
    clock = Clock()
    bus = EventBus(clock=clock)
    recorded = bus.subscribe(100_000)
    async with anyio.create_task_group() as tg:
        # a long grace: however slow the machine, the viewer gets to read everything
        assert await tg.start(partial(serve_events, bus, sock_path, grace_s=60)) == sock_path
        bus.emit(STARTED)  # the server replays it to each viewer as it connects
        viewer = await attach(bus, sock_path)
        emit_session(bus, clock, announce=False)
        bus.close()  # the server drains the viewer's buffer, then hangs up
        received = await viewer.read_all()
        await viewer.stream.aclose()
    emitted = [item async for item in recorded]
    assert received == emitted[1:]  # all after the replayed start, in order, no loss
    assert len(received) > 40
    assert not sock_path.exists()  # removed when the bus closed


@pytest.mark.anyio
async def test_socket_is_private(sock_path: Path) -> None:
    bus = EventBus()
    async with anyio.create_task_group() as tg:
        await tg.start(serve_events, bus, sock_path)
        assert stat.S_ISSOCK(sock_path.stat().st_mode)
        assert stat.S_IMODE(sock_path.stat().st_mode) == 0o600
        assert stat.S_IMODE(sock_path.parent.stat().st_mode) == 0o700
        tg.cancel_scope.cancel()
    assert not sock_path.exists()  # removed when cancelled, too


@pytest.mark.anyio
async def test_a_viewer_that_never_reads_only_loses_events(sock_path: Path) -> None:
    bus = EventBus()
    flood = 20_000  # a few MB of JSON: far past what the socket buffers hold
    async with anyio.create_task_group() as tg:
        await tg.start(partial(serve_events, bus, sock_path, max_buffer=16))
        bus.emit(STARTED)
        stuck = await attach(bus, sock_path)
        for i in range(flood):
            bus.emit(Queued(t=i * 1e-3, step=i, turn=i, agent="a", priority=0, tokens=7))
            if i % 50 == 0:
                await anyio.sleep(0)  # let the server write until the socket is full
        # The bus never waited on the viewer: all of it was emitted. Now the
        # viewer reads; it gets what was buffered and a count of what it lost.
        events, dropped = 0, 0
        with anyio.fail_after(120):  # a hang guard, not a speed check
            while dropped == 0 or events + dropped < flood:
                item = await stuck.read()
                if isinstance(item, Dropped):
                    dropped += item.count
                else:
                    assert isinstance(item, Queued)
                    events += 1
        assert dropped > 0 and events + dropped == flood
        # and it is live again: a new event arrives
        bus.emit(SwarmStopped(t=99.0, step=flood))
        assert isinstance((await stuck.read()), SwarmStopped)
        await stuck.stream.aclose()
        tg.cancel_scope.cancel()
    assert bus.counts[Queued] == flood


@pytest.mark.anyio
async def test_viewers_that_never_read_cost_nothing_while_the_swarm_steps(sock_path: Path) -> None:
    bus = EventBus()
    waits = RoomWaits()
    stuck_viewers, steps = 50, 40
    async with anyio.create_task_group() as tg:
        await tg.start(partial(serve_events, bus, sock_path, max_buffer=10_000, waits=waits))
        bus.emit(STARTED)
        viewers = [await attach(bus, sock_path) for _ in range(stuck_viewers)]
        # Flood until every viewer's socket is full and its task waits for room.
        flooded = 0
        while waits.waiting < stuck_viewers:
            for _ in range(500):
                bus.emit(Queued(t=0.0, step=flooded, turn=flooded, agent="a", priority=0, tokens=7))
                flooded += 1
            await anyio.wait_all_tasks_blocked()
        assert waits.wakeups == 0
        # A decode loop steps on while the viewers read nothing: each step emits
        # and then waits on its device (real time passes, as it does on a GPU).
        for step in range(steps):
            bus.emit(Queued(t=1.0, step=flooded + step, turn=step, agent="a", priority=0, tokens=7))
            await anyio.sleep(0.005)
        await anyio.wait_all_tasks_blocked()
        # Not one of the stuck viewers was woken, all of them still wait.
        assert waits.wakeups == 0 and waits.waiting == stuck_viewers
        # A viewer that reads again is woken by its socket's room and catches up,
        # skipping what it lost.
        bus.emit(SwarmStopped(t=2.0, step=flooded + steps))
        reader = viewers[0]
        with anyio.fail_after(60):  # a hang guard, not a speed check
            while not isinstance(item := await reader.read(), SwarmStopped):
                assert isinstance(item, (Queued, Dropped))
        assert waits.wakeups >= 1 and waits.waiting == stuck_viewers - 1
        for viewer in viewers:
            await viewer.stream.aclose()
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_stuck_viewer_does_not_hold_up_the_swarm_stopping(sock_path: Path) -> None:
    bus = EventBus()
    # A hang guard, not a speed check: without the grace period the server would
    # wait on the stuck viewer forever and leaving the task group would hang.
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(partial(serve_events, bus, sock_path, max_buffer=16, grace_s=0.05))
            bus.emit(STARTED)
            stuck = await attach(bus, sock_path)
            for i in range(20_000):
                bus.emit(Queued(t=0.0, step=i, turn=i, agent="a", priority=0, tokens=7))
                if i % 50 == 0:
                    await anyio.sleep(0)
            bus.close()  # serve_events returns by itself, which lets the group exit
    assert not sock_path.exists()
    await stuck.stream.aclose()


@pytest.mark.anyio
async def test_viewers_coming_and_going_do_not_disturb_the_others(sock_path: Path) -> None:
    bus = EventBus()
    async with anyio.create_task_group() as tg:
        await tg.start(serve_events, bus, sock_path)
        bus.emit(STARTED)
        steady = await attach(bus, sock_path)
        for round_ in range(5):
            # one hangs up at once, one talks nonsense, one leaves mid-stream
            quitter = await Viewer.connect(sock_path)
            await quitter.stream.aclose()
            chatty = await attach(bus, sock_path)
            await chatty.stream.send(b"hello?\n" * 1000)
            leaver = await attach(bus, sock_path)
            for i in range(100):
                bus.emit(Queued(t=float(i), step=round_ * 100 + i, turn=i, agent="a", priority=0, tokens=7))
            await leaver.stream.aclose()  # unread events pending: the server's write fails
            await chatty.stream.aclose()
            await anyio.sleep(0)
        bus.emit(SwarmStopped(t=999.0, step=999))
        items = []
        while not items or not isinstance(items[-1], SwarmStopped):
            items.append(await steady.read())
        assert [e.step for e in items[:-1]] == list(range(500))
        # the server still accepts viewers
        late = await attach(bus, sock_path)
        bus.close()
        assert await late.read_all() == []
        for viewer in (steady, late):
            await viewer.stream.aclose()
    # every viewer's subscription was released (only the server's own tap remained, now closed too)
    assert not bus._subscribers


@pytest.mark.anyio
async def test_a_late_viewer_learns_how_the_swarm_started(sock_path: Path) -> None:
    bus = EventBus()
    bus.emit(STARTED)  # even before the server was up
    async with anyio.create_task_group() as tg:
        await tg.start(serve_events, bus, sock_path)
        for i in range(3):
            bus.emit(Queued(t=float(i), step=i, turn=i, agent="a", priority=0, tokens=7))
        viewer = await Viewer.connect(sock_path)
        assert await viewer.read() == STARTED  # replayed, though emitted before it connected
        bus.emit(SwarmStopped(t=9.0, step=9))
        assert isinstance((await viewer.read()), SwarmStopped)
        await viewer.stream.aclose()
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_viewer_misses_nothing_emitted_between_its_connect_and_the_accept(sock_path: Path) -> None:
    bus = EventBus()
    bus.emit(STARTED)
    async with anyio.create_task_group() as tg:
        await tg.start(serve_events, bus, sock_path)
        # A plain blocking connect: the kernel completes it at once, and the event
        # below is emitted before the server's event loop has had a turn to accept.
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        raw.connect(os.fsdecode(sock_path))
        bus.emit(Queued(t=1.0, step=1, turn=1, agent="early", priority=0, tokens=3))
        bus.emit(SwarmStopped(t=2.0, step=2))
        bus.close()
        raw.setblocking(False)
        viewer = Viewer(await anyio.abc.UNIXSocketStream.from_socket(raw))
        with anyio.fail_after(30):
            items = await viewer.read_all()
        await viewer.stream.aclose()
    assert [type(i) for i in items] == [SwarmStarted, Queued, SwarmStopped]


@pytest.mark.anyio
async def test_a_viewer_still_not_reading_at_shutdown_is_told_what_it_lost_before_the_stream_closes(sock_path: Path) -> None:
    bus = EventBus()
    flood = 20_000
    with anyio.fail_after(60):  # a hang guard
        async with anyio.create_task_group() as tg:
            await tg.start(partial(serve_events, bus, sock_path, max_buffer=16, grace_s=0.05))
            bus.emit(STARTED)
            stuck = await attach(bus, sock_path)
            for i in range(flood):
                bus.emit(Queued(t=0.0, step=i, turn=i, agent="a", priority=0, tokens=7))
                if i % 50 == 0:
                    await anyio.sleep(0)
            bus.close()  # the swarm stops while the viewer still reads nothing
        # Only now does it read: whole lines, and at the end the count of the rest.
        items = await stuck.read_all()
        await stuck.stream.aclose()
    events = sum(isinstance(i, Queued) for i in items)
    dropped = sum(i.count for i in items if isinstance(i, Dropped))
    assert isinstance(items[-1], Dropped)
    assert events + dropped == flood
