"""What a session's slots did, from its events: the model the timeline draws.

Each stretch a turn ran in a slot is a run, each stretch it was paused (holding
no slot) a pause; each foreground turn's wait for its first slot is a wait, and
each preemption a point; each stretch an agent ran at a priority lent by a
waiter is a band. A cluster's merged stream gets one lane group per owner.
`foreground_answers` gives each foreground turn's tokens over time, as its
reader saw them arrive.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from runtime.events.kinds import Admitted, Ended, Event, Inherited, Preempted, Queued, Restored, Resumed, SwarmStarted, fields_of
from runtime.scheduling.priority import FOREGROUND


@dataclass
class Span:
    turn: int
    agent: str
    start: float
    end: float
    slot: int | None  # None: a pause (the turn held no slot)
    foreground: bool
    open: bool = False  # still going when the file ended


@dataclass
class Wait:
    turn: int
    agent: str
    queued: float
    admitted: float
    slot: int
    waited: float  # seconds; the owner's own measure (waited_s) where it gave one


@dataclass
class Band:
    agent: str  # the agent lent the priority
    by_agent: str  # the waiter it was lent by
    priority: int
    start: float
    end: float
    open: bool = False  # still lent when the file ended


@dataclass
class Timeline:
    runs: list[Span]
    pauses: list[Span]
    waits: list[Wait]  # foreground turns only
    preemptions: list[tuple[float, int]]  # (t, slot)
    slots: int
    agents: list[str]  # in order of first appearance
    start: float
    end: float
    started: SwarmStarted | None
    lane_names: list[str] | None = None  # a cluster's "gpu0 slot 0", ... (None: "slot N")
    bands: list[Band] = field(default_factory=list)  # lent priority, in order of start


@dataclass
class _Turn:
    agent: str
    foreground: bool
    queued: float | None = None
    slot: int | None = None
    since: float | None = None  # start of the current run or pause
    paused: bool = False


def owner_lanes(events: list[Event]) -> tuple[list[Event], list[str] | None]:
    """A cluster's merged stream drawn as one lane group per owner: slot s of an
    owner becomes lane (lanes of the owners before it) + s. Without owners, as is."""

    def owner(e: Event) -> str | None:
        return getattr(e, "owner", None)  # (an unrecognized kind has none)

    owners = sorted({o for e in events if (o := owner(e))})
    if not owners:
        return events, None
    sizes = {owner(e): e.slots or 0 for e in events if isinstance(e, SwarmStarted) and owner(e)}
    for e in events:
        if owner(e) and getattr(e, "slot", None) is not None:
            sizes[owner(e)] = max(sizes.get(owner(e), 0), e.slot + 1)
    base, names = {}, []
    for o in owners:
        base[o] = len(names)
        names += [f"{o} slot {s}" for s in range(max(sizes.get(o, 0), 1))]
    lanes = [
        msgspec.structs.replace(e, slot=base[owner(e)] + e.slot) if owner(e) and getattr(e, "slot", None) is not None else e
        for e in events
        if not (isinstance(e, SwarmStarted) and owner(e))  # the driver's own start counts every slot
    ]
    return lanes, names


def build_timeline(events: list[Event]) -> Timeline:
    """Turn the event sequence into spans per slot and per paused turn."""
    events, lane_names = owner_lanes(events)
    runs: list[Span] = []
    pauses: list[Span] = []
    waits: list[Wait] = []
    preemptions: list[tuple[float, int]] = []
    turns: dict[int, _Turn] = {}
    agents: dict[str, None] = {}
    bands: list[Band] = []
    lent: dict[str, Band] = {}  # agent -> its band still open
    started = next((e for e in events if isinstance(e, SwarmStarted)), None)
    max_slot = -1

    def close(turn_id: int, state: _Turn, t: float, open_: bool = False) -> None:
        if state.since is None:
            return
        span = Span(turn_id, state.agent, state.since, t, None if state.paused else state.slot, state.foreground, open_)
        (pauses if state.paused else runs).append(span)
        state.since = None

    for e in events:
        fields = fields_of(e)
        if fields.get("agent") is not None:
            agents.setdefault(fields["agent"], None)
        if fields.get("slot") is not None:
            max_slot = max(max_slot, fields["slot"])
        if isinstance(e, (Inherited, Restored)):
            if (band := lent.pop(e.agent, None)) is not None:  # a new lift replaces the last
                band.end = e.t
            if isinstance(e, Inherited):
                lent[e.agent] = Band(e.agent, e.by_agent, e.priority, e.t, e.t)
                bands.append(lent[e.agent])
            continue
        if not isinstance(e, (Queued, Admitted, Preempted, Resumed, Ended)):
            continue
        state = turns.get(e.turn)
        if state is None:
            state = turns[e.turn] = _Turn(e.agent, e.priority >= FOREGROUND)
        match e:
            case Queued():
                state.queued = e.t
            case Admitted():
                state.slot, state.since, state.paused = e.slot, e.t, False
                if state.foreground and e.slot is not None:
                    queued = state.queued if state.queued is not None else e.t - (e.waited_s or 0.0)
                    waited = e.waited_s if e.waited_s is not None else e.t - queued
                    waits.append(Wait(e.turn, state.agent, queued, e.t, e.slot, waited))
            case Preempted():
                state.slot = e.slot if e.slot is not None else state.slot
                close(e.turn, state, e.t)
                if state.slot is not None:
                    preemptions.append((e.t, state.slot))
                state.paused, state.since = True, e.t
            case Resumed():
                close(e.turn, state, e.t)
                state.slot, state.since, state.paused = e.slot, e.t, False
            case Ended():
                close(e.turn, state, e.t)
                del turns[e.turn]

    end = max(e.t for e in events)
    for turn_id, state in turns.items():
        close(turn_id, state, end, open_=True)
    for band in lent.values():
        band.end, band.open = end, True
    slots = max(started.slots if started and started.slots else 0, max_slot + 1, 1)
    return Timeline(
        runs,
        pauses,
        waits,
        preemptions,
        max(slots, len(lane_names or ())),
        list(agents),
        min(e.t for e in events),
        end,
        started,
        lane_names,
        bands,
    )


def foreground_answers(events: list[Event]) -> list[tuple[int, str, list[float]]]:
    """(turn, agent, token times) for each ended foreground turn: what its reader
    saw arrive, token by token. A log written before end events carried
    `token_s` gives only the first token and the mean gap; it is drawn from those."""
    asked: dict[int, float] = {}
    out = []
    for e in events:
        if isinstance(e, Queued) and e.priority >= FOREGROUND:
            asked[e.turn] = e.t
        elif isinstance(e, Ended) and e.turn in asked and e.ttft_s is not None and e.tokens:
            start = asked.pop(e.turn)
            if e.token_s:
                times = [start + s for s in e.token_s]
            else:
                times = [start + e.ttft_s + k * (e.itl_s or 0.0) for k in range(e.tokens)]
            out.append((e.turn, e.agent, times))
    return out
