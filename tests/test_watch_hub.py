"""`swarm watch`'s hub alone: the stream of batches a page reads, its history,
its resumption, and what fifty pages cost the bus. (The page itself, in a real
browser, is tests/test_watch.py.)"""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from functools import partial

import anyio
import pytest

from runtime.events.bus import EventBus
from runtime.events.kinds import Admitted, Dropped, Queued, SwarmStarted, decode, kind_named
from runtime.events.stream import encode_line
from swarm.viewers.watch import WatchHub, bind_loopback, create_app, follow_bus, serve_http

# ---------------------------------------------------------------- the hub alone


def parse_sse(chunks: list[bytes]) -> list[dict]:
    """Server-sent event frames as dicts: {"event", "id", "data"}, with the data
    lines joined by newlines, as a browser does."""
    frames = []
    for block in b"".join(chunks).decode().split("\n\n"):
        fields: dict = {"event": "message"}
        for line in block.splitlines():
            if line.startswith(":") or not line:
                continue
            key, _, value = line.partition(": ")
            fields[key] = fields[key] + "\n" + value if key == "data" and "data" in fields else value
        if "data" in fields:
            frames.append(fields)
    return frames


def lines_in(frames: list[dict]) -> list[dict]:
    """The stream's JSON lines in the frames: each message a batch, a line an event."""
    return [json.loads(line) for f in frames if f["event"] == "message" for line in f["data"].split("\n")]


def events_in(frames: list[dict]) -> list:
    """The stream's events in the frames, as their classes."""
    return [decode(json.dumps(line)) for line in lines_in(frames)]


async def read_stream(hub: WatchHub, last_id: str | None = None) -> list[dict]:
    """Everything a page would get now, stopping once it waits for more."""
    chunks = []
    stream = hub.stream(last_id)
    with anyio.move_on_after(0.2):  # the stream only ever waits for news here
        async for chunk in stream:
            chunks.append(chunk)
    await stream.aclose()
    return parse_sse(chunks)


def line(name: str, **fields) -> bytes:
    return encode_line(kind_named(name)(t=fields.pop("t", 0.0), step=fields.pop("step", 0), **fields))


@pytest.mark.anyio
async def test_a_page_gets_the_whole_session_and_resumes_exactly_where_it_was():
    hub = WatchHub()
    hub.publish(line("swarm.started", unix_time=1.0, slots=2))
    hub.publish(line("turn.queued", turn=1, agent="a", priority=0, tokens=3))
    first = await read_stream(hub)
    assert [f["event"] for f in first[:2]] == ["hello", "reset"]
    assert [type(e) for e in events_in(first)] == [SwarmStarted, Queued]
    hub.publish(line("turn.admitted", turn=1, agent="a", priority=0, slot=0))
    again = await read_stream(hub, first[-1]["id"])
    assert "reset" not in [f["event"] for f in again]
    assert [type(e) for e in events_in(again)] == [Admitted]
    # An id from another hub (a restarted server) starts over.
    other = await read_stream(WatchHub(), first[-1]["id"])
    assert [f["event"] for f in other[:2]] == ["hello", "reset"]


@pytest.mark.anyio
async def test_a_page_behind_the_bounded_history_is_told_how_many_events_it_lost():
    hub = WatchHub(max_history=10)
    hub.publish(line("swarm.started", unix_time=1.0, slots=2))
    seen = await read_stream(hub)
    for i in range(25):
        hub.publish(line("turn.queued", turn=i, agent="a", priority=0, tokens=3))
    later = events_in(await read_stream(hub, seen[-1]["id"]))
    # 26 events in all; the page had read the first; the history keeps the last few.
    assert hub.base + len(hub.history) == 26 and hub.base > 1
    assert later[0] == Dropped(hub.base - 1)
    assert len(later) == 1 + len(hub.history)


@pytest.mark.anyio
async def test_a_new_swarm_starts_pages_over_and_the_same_swarm_again_is_a_gap():
    hub = WatchHub()
    hub.publish(line("swarm.started", unix_time=1.0, slots=2))
    seen = await read_stream(hub)
    hub.publish(line("swarm.started", unix_time=1.0, slots=2))  # the socket reconnected
    gap = await read_stream(hub, seen[-1]["id"])
    assert lines_in(gap) == [{"event": "events.dropped", "count": None}]
    hub.publish(line("swarm.started", unix_time=2.0, slots=4))  # the next swarm
    new = await read_stream(hub, gap[-1]["id"])
    assert "reset" in [f["event"] for f in new]
    assert [e.slots for e in events_in(new)] == [4]


@pytest.mark.asyncio
async def test_fifty_pages_cost_the_bus_one_subscriber_share_each_batch_and_a_stalled_one_holds_no_one_up():
    bus, hub = EventBus(), WatchHub()
    n, events = 50, 3000  # enough that the stalled page's socket buffers fill up
    received, messages = [0] * n, [0] * n

    async def page(i: int, port: int) -> None:
        async with await anyio.connect_tcp("127.0.0.1", port) as conn:
            # HTTP/1.0: the body comes whole, not in chunks, so frames can be counted in it.
            await conn.send(b"GET /watch/events HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            if i == 0:
                await anyio.sleep_forever()  # opens the stream, never reads it
            rest = b""
            while received[i] < events:
                whole, _, rest = (rest + await conn.receive()).rpartition(b"\n\n")
                received[i] += whole.count(b'data: {"event":"turn.queued"')
                messages[i] += whole.count(b"\nid: ")

    with anyio.fail_after(120):
        async with page_server(hub) as url, anyio.create_task_group() as tg:
            port = int(url.rsplit(":", 1)[1].strip("/"))
            await tg.start(follow_bus, hub, bus)
            pages = anyio.CancelScope()
            tg.start_soon(_run_pages, pages, [partial(page, i, port) for i in range(n)])
            while hub.readers < n:
                await anyio.sleep(0.01)
            assert len(bus._subscribers) == 1  # the pages are the hub's, not the bus's
            for i in range(events):
                bus.emit(kind_named("turn.queued")(t=i * 0.001, step=i, turn=i, agent="a", priority=0, tokens=3))
                if i % 100 == 0:
                    await anyio.sleep(0)
            while min(received[1:]) < events:
                await anyio.sleep(0.01)
            pages.cancel()
            bus.close()
    assert received[0] == 0 and set(received[1:]) == {events}
    # Events go out in batches, not one message each, and pages that keep up
    # share each batch: it is framed once for all of them.
    assert max(messages) < events / 100 and hub.batches_built * 10 <= sum(messages)


async def _run_pages(scope: anyio.CancelScope, pages) -> None:
    with scope:
        async with anyio.create_task_group() as tg:
            for p in pages:
                tg.start_soon(p)


@asynccontextmanager
async def page_server(hub: WatchHub):
    sock = bind_loopback(0)
    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(serve_http, create_app(hub), sock, on_stop=[hub.close]))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/"
        tg.cancel_scope.cancel()
