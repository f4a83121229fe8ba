"""The wait graph: priority inheritance along chains of waits, and no cycles."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from runtime.actors.serving import MAILBOX, on_behalf
from runtime.actors.waits import WaitGraph
from runtime.errors import WaitCycle
from runtime.scheduling.priority import BACKGROUND, FOREGROUND

HANDLER = (MAILBOX,)  # a wait made inside a handler: it is in the way of the asks queued behind it


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int | None, str | None]] = []

    def __call__(self, agent: str, effective: int, inherited: int | None, origin: str | None) -> None:
        self.calls.append((agent, effective, inherited, origin))


def test_chain_inherits_and_restores() -> None:
    rec = Recorder()
    g = WaitGraph(rec)
    g.set_base("a", FOREGROUND)
    g.set_base("b", 3)
    g.set_base("c", BACKGROUND)
    bc = g.wait("b", "c", serves=HANDLER)
    assert g.effective("c") == 3 and g.inherited_from("c") == "b"
    ab = g.wait("a", "b")
    # A (foreground) waits on B's handler, which waits on C: C runs at A's priority, lent by A.
    assert (g.effective("b"), g.effective("c")) == (FOREGROUND, FOREGROUND)
    assert g.inherited_from("c") == "a"
    assert rec.calls[-2:] == [("b", FOREGROUND, FOREGROUND, "a"), ("c", FOREGROUND, FOREGROUND, "a")]
    g.release(ab)
    assert g.effective("b") == 3 and g.inherited("b") is None
    assert g.effective("c") == 3 and g.inherited("c") == 3
    g.release(bc)
    g.release(bc)  # idempotent
    assert g.inherited("c") is None and g.effective("c") == BACKGROUND
    assert rec.calls[-1] == ("c", BACKGROUND, None, None)
    assert g.edges() == {}


def test_counted_waits_between_the_same_pair() -> None:
    g = WaitGraph()
    g.set_base("a", FOREGROUND)
    first, second = g.wait("a", "b"), g.wait("a", "b")
    assert g.edges() == {("a", "b"): 2}
    g.release(first)
    assert g.effective("b") == FOREGROUND  # the second ask still waits
    g.release(second)
    assert g.effective("b") == BACKGROUND and g.holders_of("a") == frozenset()


def test_only_changes_are_notified() -> None:
    rec = Recorder()
    g = WaitGraph(rec)
    g.set_base("hi", FOREGROUND)
    g.set_base("low", BACKGROUND)
    g.wait("low", "x")  # x inherits nothing: BACKGROUND is not above its base
    assert rec.calls == []
    g.wait("hi", "x")
    g.wait("hi", "x")  # a second wait changes no priority
    assert rec.calls == [("x", FOREGROUND, FOREGROUND, "hi")]


def test_direct_and_self_cycles_are_refused() -> None:
    g = WaitGraph()
    with pytest.raises(WaitCycle, match="'a' -> 'a'|a -> a"):
        g.wait("a", "a")
    g.wait("a", "b")
    g.wait("b", "c")
    with pytest.raises(WaitCycle) as info:
        g.wait("c", "a")
    assert "c -> a -> b -> c" in str(info.value)
    assert info.value.chain == ["c", "a", "b", "c"]
    assert g.edges() == {("a", "b"): 1, ("b", "c"): 1}  # nothing recorded


def test_waiting_context_releases_on_error() -> None:
    g = WaitGraph()
    g.set_base("a", FOREGROUND)
    with pytest.raises(KeyError):
        with g.waiting("a", "b"):
            assert g.effective("b") == FOREGROUND
            raise KeyError("boom")
    assert g.effective("b") == BACKGROUND and g.edges() == {}


def test_base_change_flows_downstream() -> None:
    rec = Recorder()
    g = WaitGraph(rec)
    g.wait("a", "b")
    g.wait("b", "c", serves=HANDLER)
    g.set_base("a", 7)
    assert g.effective("c") == 7 and g.inherited_from("c") == "a"
    g.set_base("c", 7)  # its own base now matches: it no longer borrows
    assert g.inherited("c") is None
    assert rec.calls[-1] == ("c", 7, None, None)


def test_an_agent_forgotten_while_waited_on_leaves_nothing_once_the_wait_ends() -> None:
    # An outside caller of `swarm serve` whose last request ended while an
    # in-process agent still waited on it: forgotten then, kept for the wait.
    g = WaitGraph()
    g.set_base("aider", BACKGROUND)
    g.set_base("planner", FOREGROUND)
    on_it = g.wait("planner", "aider")
    g.forget("aider")
    assert g.effective("aider") == FOREGROUND  # still counts while waited on
    g.release(on_it)
    assert "aider" not in g._base and not g._gone
    # The same for an agent that still waited on someone when it was forgotten,
    # and one that came back meanwhile keeps its base.
    g.set_base("asker", 3)
    asks = g.wait("asker", "planner")
    g.forget("asker")
    g.release(asks)
    assert "asker" not in g._base and not g._gone
    g.set_base("back", 3)
    waits = g.wait("planner", "back")
    g.forget("back")
    g.set_base("back", 4)
    g.release(waits)
    assert g.base("back") == 4 and not g._gone
    assert set(g._base) == {"planner", "back"}


def test_bad_priority_is_named() -> None:
    with pytest.raises(TypeError, match="priority of 'a'"):
        WaitGraph().set_base("a", "high")  # type: ignore[arg-type]


AGENTS = ["a", "b", "c", "d", "e"]
PARTS = [MAILBOX, "lock:x"]


class WaitGraphMachine(RuleBasedStateMachine):
    """Drives the graph with random waits (on random parts, made from random
    parts of the waiter), releases and base changes, and checks it against a
    brute-force model after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.notified: dict[str, int | None] = {}
        self.graph = WaitGraph(self.on_change)
        self.base: dict[str, int] = {}
        self.handles: list = []

    def on_change(self, agent: str, effective: int, inherited: int | None, origin: str | None) -> None:
        assert self.notified.get(agent) != inherited, "notified without a change"
        self.notified[agent] = inherited
        if inherited is not None:
            assert origin is not None and self.model_base(origin) == inherited

    def model_base(self, agent: str) -> int:
        return self.base.get(agent, BACKGROUND)

    def model_edges(self) -> set[tuple[str, str]]:
        return {(h.waiter, h.holder) for h in self.handles if not h.released}

    def model_lent(self, handle) -> int:
        """What a wait lends: its waiter's base, or more where a wait on a part
        of the waiter that the waiting code serves lends more."""
        live = [h for h in self.handles if not h.released]
        return max(
            [self.model_base(handle.waiter)] + [self.model_lent(h) for h in live if h.holder == handle.waiter and h.via in handle.serves]
        )

    def model_lifts(self, agent: str) -> dict[str, int]:
        lifts: dict[str, int] = {}
        for h in self.handles:
            if not h.released and h.holder == agent and self.model_lent(h) > self.model_base(agent):
                lifts[h.via] = max(lifts.get(h.via, self.model_lent(h)), self.model_lent(h))
        return lifts

    def transitive_waiters(self, agent: str) -> set[str]:
        edges = self.model_edges()
        seen: set[str] = set()
        stack = [agent]
        while stack:
            node = stack.pop()
            for waiter, holder in edges:
                if holder == node and waiter not in seen:
                    seen.add(waiter)
                    stack.append(waiter)
        return seen

    @rule(agent=st.sampled_from(AGENTS), priority=st.integers(-3, 12))
    def set_base(self, agent: str, priority: int) -> None:
        self.base[agent] = priority
        self.graph.set_base(agent, priority)

    @rule(
        waiter=st.sampled_from(AGENTS), holder=st.sampled_from(AGENTS), via=st.sampled_from(PARTS), serves=st.sets(st.sampled_from(PARTS))
    )
    def wait(self, waiter: str, holder: str, via: str, serves: set[str]) -> None:
        would_cycle = waiter == holder or holder in self.transitive_waiters(waiter)
        if would_cycle:
            before = self.graph.edges()
            with pytest.raises(WaitCycle) as info:
                self.graph.wait(waiter, holder, via, serves=tuple(sorted(serves)))
            chain = info.value.chain
            assert chain[0] == chain[-1] == waiter and chain[1] == holder
            edges = self.model_edges()
            assert all(pair in edges for pair in zip(chain[1:], chain[2:], strict=False))
            assert self.graph.edges() == before
        else:
            self.handles.append(self.graph.wait(waiter, holder, via, serves=tuple(sorted(serves))))

    @precondition(lambda self: self.handles)
    @rule(index=st.integers(0, 100), twice=st.booleans())
    def release(self, index: int, twice: bool) -> None:
        handle = self.handles[index % len(self.handles)]
        self.graph.release(handle)
        if twice:
            self.graph.release(handle)

    @rule()
    def release_all(self) -> None:
        for handle in self.handles:
            self.graph.release(handle)
        for agent in AGENTS:
            assert self.graph.effective(agent) == self.model_base(agent)
            assert self.graph.inherited(agent) is None
        self.handles.clear()

    @invariant()
    def matches_brute_force(self) -> None:
        for agent in AGENTS:
            lifts = self.model_lifts(agent)
            assert self.graph.lifts(agent) == lifts
            expected = max([self.model_base(agent), *lifts.values()])
            assert self.graph.effective(agent) == expected
            inherited = expected if expected > self.model_base(agent) else None
            assert self.graph.inherited(agent) == inherited
            assert self.notified.get(agent) == inherited

    @invariant()
    def counts_match(self) -> None:
        counts: dict[tuple[str, str], int] = {}
        for h in self.handles:
            if not h.released:
                counts[(h.waiter, h.holder)] = counts.get((h.waiter, h.holder), 0) + 1
        assert self.graph.edges() == counts


WaitGraphMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_wait_graph_against_brute_force = WaitGraphMachine.TestCase


def test_each_part_of_a_holder_is_lifted_by_its_own_waiters() -> None:
    lifts: list[tuple[str, str, int | None]] = []
    g = WaitGraph(on_lift=lambda agent, via, priority: lifts.append((agent, via, priority)))
    g.set_base("pair", FOREGROUND)
    g.set_base("tests", 3)
    ask = g.wait("pair", "reviewer", "mailbox", "Review")
    lock = g.wait("tests", "reviewer", "lock:tools", "lock tools")
    assert g.lifts("reviewer") == {"mailbox": FOREGROUND, "lock:tools": 3}
    assert g.lifted("reviewer", ()) == BACKGROUND  # its own run() keeps its priority
    assert g.lifted("reviewer", ("mailbox",)) == FOREGROUND
    assert g.lifted("reviewer", ("mailbox", "lock:tools")) == FOREGROUND
    assert g.serves("reviewer") == ["Review for pair", "lock tools for tests"]
    g.release(ask)
    assert g.lifts("reviewer") == {"lock:tools": 3}
    g.release(lock)
    assert g.lifts("reviewer") == {}
    assert lifts == [
        ("reviewer", "mailbox", FOREGROUND),
        ("reviewer", "lock:tools", 3),
        ("reviewer", "mailbox", None),
        ("reviewer", "lock:tools", None),
    ]


def test_a_lifted_handler_lends_on_down_a_chain() -> None:
    g = WaitGraph()
    g.set_base("pair", FOREGROUND)
    g.wait("pair", "reviewer")  # reviewer's handler serves pair...
    with on_behalf(MAILBOX):
        g.wait("reviewer", "linter")  # ...and asks the linter (the serving context says so)
    assert g.lifts("linter") == {"mailbox": FOREGROUND}


def test_a_chain_passes_on_the_priority_of_the_waiting_code_not_of_its_agent() -> None:
    g = WaitGraph()
    g.set_base("pair", FOREGROUND)
    g.wait("pair", "reviewer")  # the pair waits on the reviewer's handler
    served = g.wait("reviewer", "linter", serves=HANDLER)  # that handler needs the linter
    own = g.wait("reviewer", "docs")  # the reviewer's own background run() needs docs
    assert g.lifts("linter") == {MAILBOX: FOREGROUND} and g.inherited_from("linter") == "pair"
    assert g.lifts("docs") == {} and g.effective("docs") == BACKGROUND
    assert g.effective("reviewer") == FOREGROUND  # the agent as a whole shows it is lifted
    assert (g.priority_of(served), g.priority_of(own)) == (FOREGROUND, BACKGROUND)
    lock = g.wait("reviewer", "tools", "lock:tools", serves=("lock:tools",))
    assert g.priority_of(lock) == BACKGROUND  # a lock section of its own, not the one the pair needs
