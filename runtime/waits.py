"""Who waits on whom, and the priority that follows from it.

An agent that waits on another (an ask in flight, a Lock held by someone else)
lends it its priority: the holder runs at the highest priority of everyone
waiting on it, transitively. If A (foreground) waits on B and B waits on C, C
runs at foreground until the waits end. Without this, a background agent holding
something a foreground agent needs would be starved by unrelated middle-priority
work: the priority inversion that hung Mars Pathfinder.

    effective(x) = max(base(x), effective(w) for every w waiting on x)

The graph never holds a cycle: a wait that would close one raises WaitCycle
naming the whole chain, so two agents waiting on each other fail at once
instead of hanging forever.

The graph keeps the waits and each agent's base priority, nothing else: every
lent priority is derived from them when asked, so there is no second copy to
keep in step. What the scheduler needs of it travels as `on_lift` calls and is
kept there (runtime.priorities), the one store of lent priority.

This is a plain synchronous object; it emits nothing itself. Whoever owns it
passes `on_change(agent, effective, inherited, from_agent)`, called exactly when
`inherited(agent)` changes: `inherited` is the borrowed priority, or None when
the agent is back at its base priority; `from_agent` is the agent whose base
priority it borrowed (the origin of the chain, not the direct waiter), or None.

What is lifted is the request, not the whole agent (runtime.serving): every wait
names the part of the holder it waits on (`via`), and `on_lift(agent, via,
priority)` is called exactly when the priority lent to one part changes (None:
no longer lifted).
"""

from __future__ import annotations

import collections
from contextlib import contextmanager
from typing import Callable, Iterator

from runtime.errors import UsageError, WaitCycle
from runtime.priority import BACKGROUND
from runtime.serving import MAILBOX, lift_key

OnChange = Callable[[str, int, "int | None", "str | None"], None]
OnLift = Callable[[str, str, "int | None"], None]

class WaitHandle:
    """One wait, as returned by `WaitGraph.wait`; give it back to `release`."""

    __slots__ = ("waiter", "holder", "via", "request", "released")

    def __init__(self, waiter: str, holder: str, via: str = MAILBOX, request: str | None = None) -> None:
        self.waiter = waiter
        self.holder = holder
        self.via = via
        self.request = request
        self.released = False

    def __repr__(self) -> str:
        state = "released" if self.released else "active"
        return f"<WaitHandle {self.waiter} -> {self.holder} {state}>"


class WaitGraph:
    def __init__(self, on_change: OnChange | None = None, on_lift: OnLift | None = None) -> None:
        self._on_change = on_change
        self._on_lift = on_lift
        # holder -> via -> the waits on that part of it: (waiter, request) counted
        self._parts: dict[str, dict[str, collections.Counter[tuple[str, str | None]]]] = collections.defaultdict(dict)
        self._base: dict[str, int] = {}
        # Edges are counted: two concurrent asks from A to B are two waits, and
        # the edge lives until both end.
        self._holders: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self._waiters: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)

    # ---- reading ----------------------------------------------------------

    def base(self, agent: str) -> int:
        return self._base.get(agent, BACKGROUND)

    def effective(self, agent: str) -> int:
        return self._resolve(agent, {})[0]

    def inherited(self, agent: str) -> int | None:
        """The priority borrowed from a waiter, or None when running at base."""
        priority, origin = self._resolve(agent, {})
        return None if origin is None else priority

    def inherited_from(self, agent: str) -> str | None:
        """The agent whose base priority `agent` currently runs at, if borrowed."""
        return self._resolve(agent, {})[1]

    def lifts(self, agent: str) -> dict[str, int]:
        """The parts of `agent` that run above its base priority, and at what."""
        return self._lifts_of(agent, {})

    def lent(self, key: str) -> int | None:
        """The priority lent under a lift key (`lift_key`), or None."""
        for agent, parts in self._parts.items():
            for via in parts:
                if lift_key(agent, via) == key:
                    return self.lifts(agent).get(via)
        return None

    def lifted(self, agent: str, vias: tuple[str, ...]) -> int:
        """The priority of code of `agent` serving `vias` (see `serving`)."""
        lifts = self.lifts(agent)
        return max([self.base(agent), *(lifts[v] for v in vias if v in lifts)])

    def serves(self, agent: str) -> list[str]:
        """What each lift of `agent` serves: its waiters' requests, highest first."""
        out = []
        for via, priority in sorted(self.lifts(agent).items(), key=lambda item: -item[1]):
            for waiter, request in self._parts[agent][via]:
                if self.effective(waiter) == priority:
                    out.append(f"{request or via} for {waiter}")
        return out

    def holders_of(self, waiter: str) -> frozenset[str]:
        """Everyone `waiter` is directly waiting on."""
        return frozenset(self._holders.get(waiter, ()))

    def waiters_of(self, holder: str) -> frozenset[str]:
        """Everyone directly waiting on `holder`."""
        return frozenset(self._waiters.get(holder, ()))

    def edges(self) -> dict[tuple[str, str], int]:
        """Every (waiter, holder) pair with its count of active waits."""
        return {(w, h): n for w, hs in self._holders.items() for h, n in hs.items()}

    # ---- changing ---------------------------------------------------------

    def set_base(self, agent: str, priority: int) -> None:
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise UsageError(f"priority of {agent!r} must be an int, got {priority!r}")
        with self._changing(agent):
            self._base[agent] = priority

    def forget(self, agent: str) -> None:
        """Drop a stopped agent's base priority, unless someone still waits on its
        name (a lock, or a waiter that outlives it), where it still counts."""
        if agent not in self._waiters and agent not in self._holders and agent not in self._parts:
            self._base.pop(agent, None)

    def wait(self, waiter: str, holder: str, via: str = MAILBOX, request: str | None = None) -> WaitHandle:
        """Record that `waiter` waits on `holder` (on its part `via`, for
        `request`, a label for events). Raises WaitCycle, recording nothing, if
        `holder` already waits (transitively) on `waiter`."""
        chain = self._path(holder, waiter)
        if chain is not None:
            chain = [waiter, *chain]
            err = WaitCycle(f"{waiter!r} waiting on {holder!r} would close a cycle: {' -> '.join(chain)}", chain=chain)
            raise err
        with self._changing(holder):
            self._holders[waiter][holder] += 1
            self._waiters[holder][waiter] += 1
            self._parts[holder].setdefault(via, collections.Counter())[(waiter, request)] += 1
        return WaitHandle(waiter, holder, via, request)

    def release(self, handle: WaitHandle) -> None:
        """End a wait. Releasing the same handle twice is harmless."""
        if handle.released:
            return
        handle.released = True
        waiter, holder = handle.waiter, handle.holder
        with self._changing(holder):
            _decrement(self._holders, waiter, holder)
            _decrement(self._waiters, holder, waiter)
            parts = self._parts[holder]
            _decrement(parts, handle.via, (waiter, handle.request))
            if not parts:
                del self._parts[holder]

    @contextmanager
    def waiting(self, waiter: str, holder: str, via: str = MAILBOX, request: str | None = None) -> Iterator[WaitHandle]:
        handle = self.wait(waiter, holder, via, request)
        try:
            yield handle
        finally:
            self.release(handle)

    # ---- internals --------------------------------------------------------

    def _path(self, start: str, goal: str) -> list[str] | None:
        """Shortest chain start -> ... -> goal along wait edges, if any."""
        if start == goal:
            return [start]
        parent: dict[str, str] = {start: start}
        frontier = collections.deque([start])
        while frontier:
            node = frontier.popleft()
            for nxt in self._holders.get(node, ()):
                if nxt in parent:
                    continue
                parent[nxt] = node
                if nxt == goal:
                    path = [goal]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return path[::-1]
                frontier.append(nxt)
        return None

    @contextmanager
    def _changing(self, changed: str) -> Iterator[None]:
        """Around a change to `changed` (its base, or a wait on it): notify those
        whose lent priority the change moved. Only `changed` and the agents it
        waits on, transitively, can be affected; the body does not change who
        that is. The callbacks run once the graph is consistent, so they may read
        it, in topological order (an agent after every affected agent waiting on it)."""
        affected = self._downstream(changed)
        before_memo: dict[str, tuple[int, str | None]] = {}
        before = {a: (self._resolve(a, before_memo), self._lifts_of(a, before_memo)) for a in affected}
        yield
        memo: dict[str, tuple[int, str | None]] = {}
        notices = []
        lifted = []
        for agent in self._topological(affected):
            (was, was_from), was_lifts = before[agent]
            now, now_from = self._resolve(agent, memo)
            inherited = None if now_from is None else now
            if inherited != (None if was_from is None else was):
                notices.append((agent, now, inherited, now_from))
            lifts = self._lifts_of(agent, memo)
            lifted += [(agent, via, lifts.get(via)) for via in sorted(was_lifts.keys() | lifts.keys()) if was_lifts.get(via) != lifts.get(via)]
        if self._on_change is not None:
            for notice in notices:
                self._on_change(*notice)
        if self._on_lift is not None:
            for change in lifted:
                self._on_lift(*change)

    def _topological(self, affected: set[str]) -> list[str]:
        """Kahn's algorithm on the affected sub-graph: each agent after every
        affected agent waiting on it."""
        pending = {a: sum(1 for w in self._waiters.get(a, ()) if w in affected) for a in affected}
        ready = collections.deque(a for a in affected if pending[a] == 0)
        order = []
        while ready:
            agent = ready.popleft()
            order.append(agent)
            for nxt in self._holders.get(agent, ()):
                pending[nxt] -= 1
                if pending[nxt] == 0:
                    ready.append(nxt)
        return order

    def _resolve(self, agent: str, memo: dict[str, tuple[int, str | None]]) -> tuple[int, str | None]:
        """(effective priority, the agent whose base it is when borrowed, else
        None): the highest of its base and its waiters' effective priorities, the
        first waiter to reach it winning a tie. `memo` spares re-walking shared
        waiters within one question."""
        if agent not in memo:
            best, origin = self.base(agent), None
            for waiter in self._waiters.get(agent, ()):
                priority, their_origin = self._resolve(waiter, memo)
                if priority > best:
                    best, origin = priority, their_origin or waiter
            memo[agent] = (best, origin)
        return memo[agent]

    def _lifts_of(self, agent: str, memo: dict[str, tuple[int, str | None]]) -> dict[str, int]:
        """What each part of `agent` is lent, where above its base: the highest
        effective priority of those waiting on that part."""
        base = self.base(agent)
        lifts = {}
        for via, waits in self._parts.get(agent, {}).items():
            top = max(self._resolve(waiter, memo)[0] for waiter, _ in waits)
            if top > base:
                lifts[via] = top
        return lifts

    def _downstream(self, start: str) -> set[str]:
        seen = {start}
        stack = [start]
        while stack:
            for nxt in self._holders.get(stack.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return seen


def _decrement(table: dict, key: str, item: object) -> None:
    counter = table.get(key)
    if counter is None or counter[item] <= 0:
        raise RuntimeError(f"wait graph out of sync: no wait {key} / {item} to release")
    counter[item] -= 1
    if counter[item] == 0:
        del counter[item]
        if not counter:
            del table[key]

