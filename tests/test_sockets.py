"""Where event sockets live (runtime/events/sockets.py): the default path `swarm tail`
finds, live sockets told from stale ones, and paths refused before anything is
overwritten."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import anyio
import msgspec
import pytest

from runtime.errors import ConfigError
from runtime.events.bus import EventBus
from runtime.events.kinds import Queued, SwarmStarted
from runtime.events.stream import default_socket_dir, default_socket_path, live_sockets, serve_events
from swarm.viewers import tail

STARTED = SwarmStarted(t=0.0, step=0, unix_time=1.7e9, slots=4, policy="preempt")


@pytest.mark.anyio
async def test_tail_follows_the_newest_live_swarm(sock_path: Path, monkeypatch) -> None:
    runtime_dir = sock_path.parent.parent  # short, and private to this test
    runtime_dir.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime_dir))
    path = default_socket_path()
    assert path.parent == default_socket_dir() == runtime_dir / "slotswarm"
    bus = EventBus()
    async with anyio.create_task_group() as tg:
        await tg.start(serve_events, bus, path)
        bus.emit(STARTED)
        kind, found = await anyio.to_thread.run_sync(tail.resolve_source, None)
        assert (kind, found) == ("socket", path)
        connected = anyio.Event()

        def read_in_a_thread() -> list:
            lines = tail.read_socket(found)
            first = next(lines)
            anyio.from_thread.run_sync(connected.set)
            return [first] + list(lines)

        async def emit_when_connected() -> None:
            await connected.wait()
            for i in range(10):
                bus.emit(Queued(t=float(i), step=i, turn=i, agent="a", priority=0, tokens=7))
            bus.close()

        tg.start_soon(emit_when_connected)
        lines = await anyio.to_thread.run_sync(read_in_a_thread)
    assert [item for _, item in lines][0] == STARTED
    assert [item.step for _, item in lines[1:]] == list(range(10))
    assert all(raw.endswith(b"\n") and msgspec.json.decode(raw) for raw, _ in lines)
    assert not path.exists()


def test_live_sockets_skips_stale_ones(tmp_path: Path) -> None:
    directory = Path("/tmp") / f"ssw-live-{os.getpid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    try:
        stale = directory / "dead.sock"
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(stale))  # bound, never listening: like a swarm that died
        live = directory / "live.sock"
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(live))
            s.listen()
            (directory / "notes.sock").write_text("not a socket")
            assert live_sockets(directory) == [live]
        assert live_sockets(directory) == []
        assert live_sockets(directory / "missing") == []
    finally:
        for p in directory.iterdir():
            p.unlink()
        directory.rmdir()


@pytest.mark.anyio
async def test_refuses_a_path_in_use_or_too_long(sock_path: Path) -> None:
    bus = EventBus()
    async with anyio.create_task_group() as tg:
        await tg.start(serve_events, bus, sock_path)
        with pytest.raises(ConfigError, match="another swarm is already serving"):
            await serve_events(bus, sock_path)
        tg.cancel_scope.cancel()
    with pytest.raises(ConfigError, match="at most 107"):
        await serve_events(bus, sock_path.parent / ("x" * 120 + ".sock"))
    sock_path.parent.mkdir(parents=True, exist_ok=True)
    sock_path.write_text("precious")
    with pytest.raises(ConfigError, match="not a socket"):
        await serve_events(bus, sock_path)
    assert sock_path.read_text() == "precious"
