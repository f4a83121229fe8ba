"""Priority: what a turn runs at, in one vocabulary.

Priorities are integers: higher runs first. Two names cover the common case,
BACKGROUND and FOREGROUND. A turn has four:

- base: its agent's own (`Turn.priority`);
- aged: base plus a level for every `SchedulerConfig.aging_s` it has waited, up
  to `aging_cap` (a running turn keeps the levels it was admitted with, so the
  turn it displaced cannot displace it straight back);
- lent: the highest priority lent to a name it was submitted under (its `lifts`:
  its agent's name, and the lift keys of the requests it serves);
- effective: the maximum of aged and lent. Admission, preemption, the queue's
  order and every event's `priority` use it.

Step shaping and step abandonment protect a turn by its effective priority
before aging (`unaged`: the maximum of base and lent), since aging only
reorders background work among itself.

Who lends what is worked out by the actor system's wait graph (runtime.actors.waits),
which keeps only the waits themselves and derives the priority from them. What
reaches the scheduler is its outcome, one lift key at a time (`lend`; a
SetInherited message on an owner, which may live in another process), and
`Priorities.lent` is the only place it is kept.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from runtime.errors import UsageError

if TYPE_CHECKING:
    from runtime.scheduling.turns import Turn

BACKGROUND = 0
FOREGROUND = 10


class Priorities:
    def __init__(self, aging_s: float, aging_cap: int) -> None:
        self.aging_s = aging_s
        self.aging_cap = aging_cap
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

    def effective(self, turn: Turn, now: float) -> int:
        """max(aged, lent)."""
        aged = turn.priority
        if aged < self.aging_cap:
            levels = turn.aging_kept if turn.slot is not None else self.aging_levels(turn, now)
            if levels:
                aged = min(aged + levels, self.aging_cap)
        return self._with_lent(turn.lifts, aged) if self.lent else aged

    def unaged(self, turn: Turn) -> int:
        """max(base, lent): the effective priority before aging."""
        if not self.lent:  # (the common case, asked of every running turn at every shaped step)
            return turn.priority
        return self._with_lent(turn.lifts, turn.priority)

    def unaged_of(self, base: int, lifts: Iterable[str]) -> int:
        """The `unaged` priority a turn submitted now at `base` under `lifts` (its
        agent's name among them) would have."""
        return self._with_lent(lifts, base)

    def top_unaged(self, turns: Iterable[Turn]) -> int | None:
        """The highest `unaged` priority among the turns (None if there are none)."""
        if not self.lent:
            return max([turn.priority for turn in turns], default=None)  # (a list: no generator to resume per turn)
        return max([self.unaged(turn) for turn in turns], default=None)

    def _with_lent(self, lifts: Iterable[str], priority: int) -> int:
        lent = self.lent
        if not lent:  # (the common case, asked for every turn at every step)
            return priority
        return max([priority, *(lent[k] for k in lifts if k in lent)])

    def aging_levels(self, turn: Turn, now: float) -> int:
        """Aging levels the turn has earned by waiting until `now`."""
        return int((now - turn.waiting_since) / self.aging_s)

    def next_aging(self, waiting: Iterable[Turn], now: float) -> float | None:
        """When the next of these waiting turns gains an aging level."""
        aging_s, cap, effective = self.aging_s, self.aging_cap, self.effective
        soonest = None
        for turn in waiting:
            if effective(turn, now) < cap:
                since = turn.waiting_since
                at = since + (int((now - since) / aging_s) + 1) * aging_s  # (aging_levels, inlined)
                if soonest is None or at < soonest:
                    soonest = at
        return soonest

    def queue_order(self, waiting: Iterable[Turn], now: float, *, by_priority: bool) -> list[Turn]:
        """Who gets a slot first: by effective priority (else, under FCFS, by
        arrival alone); among equals, by arrival, then by the order they
        (re)joined the queue."""
        if not by_priority:
            return sorted(waiting, key=lambda t: (t.arrived, t.enqueued))
        return sorted(waiting, key=lambda t: (-self.effective(t, now), t.arrived, t.enqueued))

    def victim(self, among: Iterable[Turn], now: float) -> Turn | None:
        """Lowest effective priority; among equals, the latest admitted."""
        return min(among, key=lambda t: (self.effective(t, now), -t.last_admit), default=None)
