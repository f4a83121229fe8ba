"""The event bus: file and terminal sinks, and lossy live subscribers."""

from __future__ import annotations

import io

import anyio
import pytest

from runtime.events.bus import EventBus
from runtime.events.kinds import Dropped, Event, Preempted, decode, encode, read_events


def sample(i: int = 0) -> Event:
    return Preempted(t=1.5, step=7 + i, turn=3, agent="tests", priority=0, slot=2, tokens=40, by_turn=9, by_agent="pair", by_priority=10)


def test_events_round_trip_through_json_with_only_their_fields():
    line = encode(sample())
    assert b"waited_s" not in line and b'"by_agent":"pair"' in line
    assert decode(line) == sample()


def test_file_sink_writes_one_json_object_a_line(tmp_path):
    bus = EventBus()
    path = bus.log_to_file(tmp_path / "e.jsonl")
    for i in range(3):
        bus.emit(sample(i))
    bus.close()
    assert list(read_events(path)) == [sample(i) for i in range(3)]


def test_terminal_sink_is_readable():
    out = io.StringIO()
    bus = EventBus()
    bus.log_to_terminal(out, colors=False)
    bus.emit(sample())
    text = out.getvalue()
    assert "turn.preempted" in text and "by_agent=pair" in text and "\n" in text


@pytest.mark.anyio
async def test_a_slow_subscriber_loses_events_and_is_told_how_many():
    bus = EventBus()
    sub = bus.subscribe(max_buffer=4)
    for i in range(10):
        bus.emit(sample(i))  # never blocks, however far behind the viewer is
    with anyio.fail_after(5):
        first = await sub.__anext__()
        bus.emit(sample(99))  # room for one again: it lands after the gap
        rest = [await sub.__anext__() for _ in range(5)]
    assert first.step == 7 and [e.step for e in rest[:3]] == [8, 9, 10]
    assert rest[3] == Dropped(6) and rest[4].step == 106
    bus.close()
    with anyio.fail_after(5):
        assert [x async for x in sub] == []
    assert bus.counts[Preempted] == 11


@pytest.mark.parametrize("size", [0, -1, 2.5, "10", True, print])
def test_a_subscription_of_no_room_is_refused_where_it_is_asked_for(size):
    from runtime.errors import UsageError

    bus = EventBus()
    with pytest.raises(UsageError, match="max_buffer must be an int of at least 1"):
        bus.subscribe(max_buffer=size)
    bus.emit(sample())  # (nothing half-made was left behind to fail here)
