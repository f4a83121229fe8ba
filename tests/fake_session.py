"""A made-up but schema-valid session on the real EventBus, for the tests of
the viewers (tail, plot, the live stream)."""

from __future__ import annotations

from runtime.events.bus import EventBus
from runtime.events.kinds import (
    Admitted,
    Event,
    Finished,
    Inherited,
    Preempted,
    Queued,
    Restored,
    Resumed,
    SwappedOut,
    SwarmStarted,
    SwarmStopped,
)
from runtime.scheduling.priority import BACKGROUND, FOREGROUND

STEP_S = 0.01  # virtual seconds per decode step


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# (step it arrives, agent, priority, tokens to generate)
ARRIVALS = [
    (0, "tests", BACKGROUND, 40),
    (0, "docs", BACKGROUND, 60),
    (1, "lint", BACKGROUND, 30),
    (2, "tests", BACKGROUND, 50),
    (5, "pair", FOREGROUND, 12),
    (6, "docs", BACKGROUND, 20),
    (9, "pair", FOREGROUND, 8),
    (20, "pair", FOREGROUND, 15),
    (22, "lint", BACKGROUND, 25),
    (40, "pair", FOREGROUND, 10),
    (41, "pair", FOREGROUND, 10),
]


def emit_session(bus: EventBus, clock: Clock, *, slots: int = 4, announce: bool = True) -> None:
    """Emit a whole session on `bus`, advancing `clock` by STEP_S per step."""
    step = 0

    def emit(kind: type[Event], **fields: object) -> None:
        bus.emit(kind(t=clock(), step=step, **fields))

    if announce:
        emit(SwarmStarted, unix_time=1.7e9, slots=slots, policy="preempt", device="pocl-cpu", model="toy")
    arrivals = list(ARRIVALS)
    queue: list[dict] = []  # waiting to be admitted or resumed
    running: dict[int, dict] = {}  # slot -> turn
    next_turn = 1
    while arrivals or queue or running:
        queue.sort(key=lambda t: -t["priority"])  # stable: oldest first within a priority
        for turn in list(queue):
            free = [s for s in range(slots) if s not in running]
            if not free and turn["priority"] >= FOREGROUND:
                victim_slot = min(
                    (s for s in running if running[s]["priority"] < turn["priority"]),
                    key=lambda s: running[s]["priority"],
                    default=None,
                )
                if victim_slot is not None:
                    victim = running.pop(victim_slot)
                    who = {"turn": victim["turn"], "agent": victim["agent"], "priority": victim["priority"]}
                    emit(
                        Preempted,
                        **who,
                        slot=victim_slot,
                        tokens=victim["done"],
                        by_turn=turn["turn"],
                        by_agent=turn["agent"],
                        by_priority=turn["priority"],
                    )
                    if victim["turn"] % 2:
                        emit(SwappedOut, **who, blocks=4)
                    victim.update(paused=True, since=clock())
                    queue.append(victim)
                    free = [victim_slot]
            if not free:
                continue
            slot = free[0]
            queue.remove(turn)
            running[slot] = turn
            who = {"turn": turn["turn"], "agent": turn["agent"], "priority": turn["priority"]}
            if turn["paused"]:
                emit(Resumed, **who, slot=slot, paused_s=round(clock() - turn["since"], 6))
            else:
                emit(Admitted, **who, slot=slot, waited_s=round(clock() - turn["since"], 6))
        # Requests arriving during this step are seen at the next token boundary.
        while arrivals and arrivals[0][0] == step:
            _, agent, prio, length = arrivals.pop(0)
            turn = {"turn": next_turn, "agent": agent, "priority": prio, "length": length, "done": 0, "since": clock(), "paused": False}
            next_turn += 1
            emit(Queued, turn=turn["turn"], agent=agent, priority=prio, tokens=7)
            queue.append(turn)
        step += 1
        clock.now += STEP_S
        for slot, turn in sorted(running.items()):
            turn["done"] += 1
            if turn["done"] == turn["length"]:
                del running[slot]
                emit(
                    Finished,
                    turn=turn["turn"],
                    agent=turn["agent"],
                    priority=turn["priority"],
                    slot=slot,
                    tokens=turn["done"],
                    reason="eos" if turn["turn"] % 3 else "length",
                )
        if step == 10:
            emit(Inherited, agent="lint", priority=FOREGROUND, base_priority=BACKGROUND, by_agent="pair")
        if step == 14:
            emit(Restored, agent="lint", priority=BACKGROUND, base_priority=BACKGROUND)
    emit(SwarmStopped, unix_time=1.7e9 + clock())
