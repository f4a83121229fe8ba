"""Who waits on whom, and the priority that follows from it.

An agent that waits on another (an ask in flight, a Lock held by someone else)
lends it its priority, transitively: if A (foreground) waits on B's handler and
that handler waits on C, C runs at foreground until the waits end. Without this,
a background agent holding what a foreground one needs would be starved by
unrelated middle-priority work: the inversion that hung Mars Pathfinder.

What is lifted is the request, not the whole agent (runtime.actors.serving). Every wait
names the part of the holder it waits on (`via`: its mailbox, or a lock's
critical section) and the parts of the waiter it is made from (`serves`: the
`serving` context where it was made), and passes on only the priority of the
code that waits. With w a wait's waiter:

    lent(wait)   = max(base(w), lent(v) for every wait v on a part of w it serves)
    effective(x) = max(base(x), lent(wait) for every wait on x)

So the pair's ask lifts the reviewer's handler and what that handler waits on,
not what the reviewer's own background run() waits on meanwhile.

The graph never holds a cycle: a wait that would close one raises WaitCycle
naming the whole chain, so two agents waiting on each other fail at once.

It keeps the waits and each agent's base priority, nothing else: every lent
priority is derived when asked, so there is no second copy to keep in step.
What the scheduler needs travels as `on_lift(agent, via, priority)` calls
(exactly when the priority lent to one part changes; None: no longer lifted)
and is kept there (runtime.scheduling.priority), the one store of lent priority. It is
a plain synchronous object that emits nothing itself; `on_change(agent,
effective, inherited, from_agent)` is called exactly when `inherited(agent)`
changes, `from_agent` being the origin of the chain, not the direct waiter.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from runtime.actors.serving import MAILBOX, lift_key, serving
from runtime.errors import UsageError, WaitCycle
from runtime.scheduling.priority import BACKGROUND

OnChange = Callable[[str, int, "int | None", "str | None"], None]
_Wait = tuple[str, "str | None", tuple[str, ...]]  # (waiter, request, the parts of the waiter it is made from)
_Memo = dict[str, dict[str, tuple[int, str]]]  # agent -> its lifts with their origins, for one question
OnLift = Callable[[str, str, "int | None"], None]


@dataclass(eq=False, slots=True)
class WaitHandle:
    """One wait, as returned by `WaitGraph.wait`; give it back to `release`."""

    waiter: str
    holder: str
    via: str = MAILBOX
    request: str | None = None
    serves: tuple[str, ...] = ()  # the parts of the waiter the waiting code serves
    released: bool = False


class WaitGraph:
    def __init__(self, on_change: OnChange | None = None, on_lift: OnLift | None = None) -> None:
        self._on_change = on_change
        self._on_lift = on_lift
        # holder -> via -> the waits on that part of it: (waiter, request, serves) counted
        self._parts: dict[str, dict[str, collections.Counter[_Wait]]] = collections.defaultdict(dict)
        self._base: dict[str, int] = {}
        # Edges are counted: two concurrent asks from A to B are two waits, and
        # the edge lives until both end.
        self._holders: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self._waiters: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        # Agents forgotten while someone still waited on them (or they on
        # someone): their base goes when their last wait ends.
        self._gone: set[str] = set()

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
        return _priorities(self._lifts_of(agent, {}))

    def priority_of(self, handle: WaitHandle) -> int:
        """The priority a wait lends: that of the code that waits."""
        return self._lent_by(handle.waiter, handle.serves, {})[0]

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
            for waiter, request, serves in self._parts[agent][via]:
                if self._lent_by(waiter, serves, {})[0] == priority:
                    out.append(f"{request or via} for {waiter}")
        return out

    def holders_of(self, waiter: str) -> frozenset[str]:
        """Everyone `waiter` is directly waiting on."""
        return frozenset(self._holders.get(waiter, ()))

    def edges(self) -> dict[tuple[str, str], int]:
        """Every (waiter, holder) pair with its count of active waits."""
        return {(w, h): n for w, hs in self._holders.items() for h, n in hs.items()}

    # ---- changing ---------------------------------------------------------

    def set_base(self, agent: str, priority: int) -> None:
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise UsageError(f"priority of {agent!r} must be an int, got {priority!r}")
        with self._changing(agent):
            self._base[agent] = priority
        self._gone.discard(agent)  # (back, or never gone)

    def forget(self, agent: str) -> None:
        """Drop a stopped agent's base priority; if someone still waits on its
        name (a lock, or a waiter that outlives it), or it still waits on
        someone, where it still counts, once the last of those waits ends."""
        if self._in_a_wait(agent):
            self._gone.add(agent)
        else:
            self._base.pop(agent, None)
            self._gone.discard(agent)

    def wait(
        self, waiter: str, holder: str, via: str = MAILBOX, request: str | None = None, serves: tuple[str, ...] | None = None
    ) -> WaitHandle:
        """Record that `waiter` waits on `holder` (on its part `via`, for
        `request`, a label for events), from code serving `serves` (default: the
        `serving` context of the caller, who is the waiter). Raises WaitCycle,
        recording nothing, if `holder` already waits (transitively) on `waiter`."""
        serves = serving.get() if serves is None else tuple(serves)
        chain = self._path(holder, waiter)
        if chain is not None:
            chain = [waiter, *chain]
            err = WaitCycle(f"{waiter!r} waiting on {holder!r} would close a cycle: {' -> '.join(chain)}", chain=chain)
            raise err
        with self._changing(holder):
            self._holders[waiter][holder] += 1
            self._waiters[holder][waiter] += 1
            self._parts[holder].setdefault(via, collections.Counter())[(waiter, request, serves)] += 1
        return WaitHandle(waiter, holder, via, request, serves)

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
            _decrement(parts, handle.via, (waiter, handle.request, handle.serves))
            if not parts:
                del self._parts[holder]
        for agent in (waiter, holder):
            if agent in self._gone and not self._in_a_wait(agent):
                self.forget(agent)

    @contextmanager
    def waiting(
        self, waiter: str, holder: str, via: str = MAILBOX, request: str | None = None, serves: tuple[str, ...] | None = None
    ) -> Iterator[WaitHandle]:
        handle = self.wait(waiter, holder, via, request, serves)
        try:
            yield handle
        finally:
            self.release(handle)

    # ---- internals --------------------------------------------------------

    def _in_a_wait(self, agent: str) -> bool:
        return agent in self._waiters or agent in self._holders or agent in self._parts

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
        before_memo: _Memo = {}
        before = {a: (self._resolve(a, before_memo), _priorities(self._lifts_of(a, before_memo))) for a in affected}
        yield
        memo: _Memo = {}
        notices = []
        lifted = []
        for agent in self._topological(affected):
            (was, was_from), was_lifts = before[agent]
            now, now_from = self._resolve(agent, memo)
            inherited = None if now_from is None else now
            if inherited != (None if was_from is None else was):
                notices.append((agent, now, inherited, now_from))
            lifts = _priorities(self._lifts_of(agent, memo))
            lifted += [
                (agent, via, lifts.get(via)) for via in sorted(was_lifts.keys() | lifts.keys()) if was_lifts.get(via) != lifts.get(via)
            ]
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

    def _resolve(self, agent: str, memo: _Memo) -> tuple[int, str | None]:
        """(effective priority, the agent whose base it is when borrowed, else
        None): the highest of its base and what any part of it is lent."""
        best, origin = self.base(agent), None
        for priority, their_origin in self._lifts_of(agent, memo).values():
            if priority > best:
                best, origin = priority, their_origin
        return best, origin

    def _lifts_of(self, agent: str, memo: _Memo) -> dict[str, tuple[int, str]]:
        """What each part of `agent` is lent, where above its base, and whose base
        priority that is: the most any wait on that part lends, the first to reach
        it winning a tie. `memo` spares re-walking shared waiters within one question."""
        if agent not in memo:
            base = self.base(agent)
            lifts: dict[str, tuple[int, str]] = {}
            for via, waits in self._parts.get(agent, {}).items():
                for waiter, _, serves in waits:
                    priority, origin = self._lent_by(waiter, serves, memo)
                    if priority > max(base, lifts[via][0] if via in lifts else base):
                        lifts[via] = (priority, origin or waiter)
            memo[agent] = lifts
        return memo[agent]

    def _lent_by(self, waiter: str, serves: tuple[str, ...], memo: _Memo) -> tuple[int, str | None]:
        """What a wait lends: the priority of the waiter's code serving `serves`
        (its base, or what one of those parts is lent), and whose base that is
        when borrowed."""
        best, origin = self.base(waiter), None
        lifts = self._lifts_of(waiter, memo)
        for via in serves:
            if via in lifts and lifts[via][0] > best:
                best, origin = lifts[via]
        return best, origin

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


def _priorities(lifts: dict[str, tuple[int, str]]) -> dict[str, int]:
    return {via: priority for via, (priority, _) in lifts.items()}
