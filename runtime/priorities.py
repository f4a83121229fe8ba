"""A turn's effective priority, and the one store of priority lent to turns.

A turn runs at the highest of its agent's base priority, aged while it waits (see
SchedulerConfig), and the priority lent to a name it was submitted under (its
`lifts`: its agent's name, and the lift keys of the requests it serves).

Who lends what is worked out by the actor system's wait graph (runtime.waits),
which keeps only the waits themselves and derives the priority from them. What
reaches the scheduler is its outcome, one lift key at a time (`lend`; a
SetInherited message on an owner, which may live in another process), and
`Priorities.lent` is the only place it is kept.
"""

from __future__ import annotations

from typing import Iterable

from runtime.errors import UsageError
from runtime.turns import Policy, SchedulerConfig, Turn


class Priorities:
    def __init__(self, config: SchedulerConfig) -> None:
        self.aging_s = config.aging_s
        self.aging_cap = config.aging_cap
        self.lent: dict[str, int] = {}  # lift key (or agent) -> the priority its turns run at, at least

    def lend(self, lift: str, priority: int | None) -> None:
        """Turns submitted under `lift` run at least at `priority` (None: back to
        their own) until told otherwise."""
        if priority is not None and (not isinstance(priority, int) or isinstance(priority, bool)):
            raise UsageError(f"inherited priority of {lift!r} must be an int or None, got {priority!r}")
        if priority is None:
            self.lent.pop(lift, None)
        else:
            self.lent[lift] = priority

    def level(self, turn: Turn) -> int:
        """The turn's own priority raised by what is lent to it, without aging: what
        step shaping protects (aging only reorders background work among itself)."""
        return self._raise(turn, turn.priority)

    def effective(self, turn: Turn, now: float) -> int:
        base = turn.priority
        if base < self.aging_cap:
            # A waiting turn ages; a running one keeps what it had aged to when
            # admitted, so the turn it displaced cannot displace it straight back.
            aged = turn.boost if turn.slot is not None else self.aged(turn, now)
            if aged:
                base = min(base + aged, self.aging_cap)
        return self._raise(turn, base) if self.lent else base

    def _raise(self, turn: Turn, base: int) -> int:
        lent = self.lent
        if not lent:  # (the common case, asked for every turn at every step)
            return base
        return max([base, *(lent[k] for k in turn.lifts if k in lent)])

    def arriving(self, priority: int, lifts: Iterable[str]) -> int:
        """The `level` a turn submitted now at `priority` under `lifts` (its agent's
        name among them) would have."""
        lent = self.lent
        return max([priority, *(lent[k] for k in lifts if k in lent)]) if lent else priority

    def top_level(self, turns: Iterable[Turn]) -> int | None:
        """The highest `level` among the turns (None if there are none)."""
        if not self.lent:
            return max((turn.priority for turn in turns), default=None)
        return max((self.level(turn) for turn in turns), default=None)

    def aged(self, turn: Turn, now: float) -> int:
        """Aging levels the turn has earned by waiting until `now`."""
        return int((now - turn.waiting_since) / self.aging_s)

    def next_aging(self, waiting: Iterable[Turn], now: float) -> float | None:
        """When the next of these waiting turns gains an aging level."""
        times = [
            turn.waiting_since + (self.aged(turn, now) + 1) * self.aging_s
            for turn in waiting
            if self.effective(turn, now) < self.aging_cap
        ]
        return min(times, default=None)

    def queue_order(self, waiting: Iterable[Turn], now: float, policy: Policy) -> list[Turn]:
        """Who gets a slot first: by arrival under FCFS, else by effective priority;
        among equals, by arrival, then by the order they (re)joined the queue."""
        if policy is Policy.FCFS:
            return sorted(waiting, key=lambda t: (t.arrived, t.enqueued))
        return sorted(waiting, key=lambda t: (-self.effective(t, now), t.arrived, t.enqueued))

    def victim(self, among: Iterable[Turn], now: float) -> Turn | None:
        """Lowest effective priority; among equals, the latest admitted."""
        return min(among, key=lambda t: (self.effective(t, now), -t.last_admit), default=None)
