"""The runtime Lock: mutual exclusion that lends priority to its holder."""

from __future__ import annotations

import anyio
import msgspec
import pytest

from runtime.actors.actor import Actor, handler
from runtime.actors.lock import Lock
from runtime.actors.system import ActorSystem
from runtime.actors.waits import WaitGraph
from runtime.errors import ActorError, WaitCycle
from runtime.events.bus import EventBus
from runtime.events.kinds import Inherited, Restored, read_events
from runtime.scheduling.priority import BACKGROUND, FOREGROUND

GUARD = 10  # seconds: a hang guard, never a threshold


class Hold(msgspec.Struct):
    """Take the lock, say so, and keep it until `until` is set."""

    lock: object
    until: object


class Critical(msgspec.Struct):
    lock: object


class User(Actor):
    inside = 0
    most_inside = 0

    def __init__(self, name: str, priority: int = BACKGROUND) -> None:
        super().__init__(name, priority)
        self.holding = anyio.Event()

    @handler
    async def hold(self, msg: Hold) -> None:
        async with msg.lock(self):
            self.holding.set()
            await msg.until.wait()

    @handler
    async def critical(self, msg: Critical) -> None:
        async with msg.lock.acquire(self):
            User.inside += 1
            User.most_inside = max(User.most_inside, User.inside)
            for _ in range(3):
                await anyio.sleep(0)  # let everyone else try to get in
            User.inside -= 1


@pytest.mark.anyio
async def test_mutual_exclusion_between_actors() -> None:
    lock = Lock("tools")
    with anyio.fail_after(GUARD):
        async with ActorSystem(EventBus()) as system:
            users = [User(f"u{i}", priority=i % 3) for i in range(6)]
            for user in users:
                await system.spawn(user)
            async with anyio.create_task_group() as tg:
                for user in users:
                    for _ in range(3):
                        tg.start_soon(user.ref.ask, Critical(lock))
            assert User.most_inside == 1 and User.inside == 0
            assert lock.holder is None and lock.waiting == []
            assert system.waits.edges() == {}


@pytest.mark.anyio
async def test_holder_inherits_waiters_priority_until_release(tmp_path) -> None:
    bus = EventBus(clock=lambda: 0.0)
    path = bus.log_to_file(tmp_path / "events.jsonl")
    lock = Lock("gpu-notes")
    with anyio.fail_after(GUARD):
        async with ActorSystem(bus) as system:
            low, high = User("low", BACKGROUND), User("high", FOREGROUND)
            await system.spawn(low)
            await system.spawn(high)
            let_go, high_done = anyio.Event(), anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(low.ref.ask, Hold(lock, let_go))
                await low.holding.wait()
                assert low.effective_priority == BACKGROUND
                tg.start_soon(high.ref.ask, Hold(lock, high_done))
                await anyio.wait_all_tasks_blocked()
                assert lock.waiting == ["high"]
                # The Mars Pathfinder fix: the background holder runs at foreground.
                assert low.effective_priority == FOREGROUND
                assert system.waits.inherited_from("low") == "high"
                let_go.set()
                await high.holding.wait()
                assert lock.holder == "high"
                assert low.effective_priority == BACKGROUND
                high_done.set()
    bus.close()

    seen = [(type(e), e.agent, e.priority, e.base_priority, getattr(e, "by_agent", None)) for e in read_events(path)]
    assert seen == [
        (Inherited, "low", FOREGROUND, BACKGROUND, "high"),
        (Restored, "low", BACKGROUND, BACKGROUND, None),
    ]


async def hold_until(lock: Lock, owner: str, until: anyio.Event, log: list[str]) -> None:
    async with lock(owner):
        log.append(owner)
        await until.wait()


@pytest.mark.anyio
async def test_next_holder_by_priority_then_arrival_and_waits_follow_the_holder() -> None:
    graph = WaitGraph()
    for name, priority in [("first", 1), ("second", 1), ("urgent", FOREGROUND)]:
        graph.set_base(name, priority)
    lock = Lock("l", waits=graph)
    log: list[str] = []
    gates = {name: anyio.Event() for name in ["holder", "first", "second", "urgent"]}
    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:
            tg.start_soon(hold_until, lock, "holder", gates["holder"], log)
            await anyio.wait_all_tasks_blocked()
            for name in ["first", "second", "urgent"]:
                tg.start_soon(hold_until, lock, name, gates[name], log)
                await anyio.wait_all_tasks_blocked()
            assert graph.effective("holder") == FOREGROUND
            assert lock.waiting == ["first", "second", "urgent"]
            gates["holder"].set()
            await anyio.wait_all_tasks_blocked()
            # urgent holds it now; the others' waits point at urgent, who lends nothing.
            assert lock.holder == "urgent"
            assert graph.edges() == {("first", "urgent"): 1, ("second", "urgent"): 1}
            assert graph.effective("holder") == BACKGROUND and graph.effective("urgent") == FOREGROUND
            for name in ["urgent", "first", "second"]:
                gates[name].set()
                await anyio.wait_all_tasks_blocked()
    assert log == ["holder", "urgent", "first", "second"]
    assert lock.holder is None and graph.edges() == {}


@pytest.mark.anyio
async def test_cancelled_waiter_leaves_nothing_behind() -> None:
    graph = WaitGraph()
    graph.set_base("high", FOREGROUND)
    lock = Lock("l", waits=graph)
    with anyio.fail_after(GUARD):
        await lock.take("low")
        async with anyio.create_task_group() as tg:
            tg.start_soon(lock.take, "high")
            await anyio.wait_all_tasks_blocked()
            assert graph.effective("low") == FOREGROUND
            tg.cancel_scope.cancel()
        assert lock.waiting == [] and graph.edges() == {}
        assert graph.effective("low") == BACKGROUND
        lock.release("low")
        assert lock.holder is None
        await lock.take("high")  # not stuck
        lock.release("high")


@pytest.mark.anyio
async def test_granted_then_cancelled_passes_the_lock_on() -> None:
    graph = WaitGraph()
    lock = Lock("l", waits=graph)
    got: list[str] = []

    async def use(name: str) -> None:
        async with lock(name):
            got.append(name)
            await anyio.sleep_forever()

    with anyio.fail_after(GUARD):
        await lock.take("a")
        async with anyio.create_task_group() as outer:
            async with anyio.create_task_group() as doomed:
                doomed.start_soon(use, "b")
                await anyio.wait_all_tasks_blocked()
                outer.start_soon(use, "c")
                await anyio.wait_all_tasks_blocked()
                lock.release("a")  # grants b ...
                assert lock.holder == "b"
                doomed.cancel_scope.cancel()  # ... which is cancelled before it runs
            await anyio.wait_all_tasks_blocked()
            assert lock.holder == "c" and graph.edges() == {}
            outer.cancel_scope.cancel()
        assert got[-1] == "c" and lock.holder is None


@pytest.mark.asyncio
async def test_cancellation_raised_after_the_grant_passes_the_lock_on() -> None:
    # anyio lets a grant win over a pending cancel scope, but a plain asyncio
    # task.cancel() still raises in the waiter after its grant: that lock must move on.
    import asyncio

    graph = WaitGraph()
    lock = Lock("l", waits=graph)
    with anyio.fail_after(GUARD):
        await lock.take("a")
        b = asyncio.get_running_loop().create_task(lock.take("b"))
        await anyio.wait_all_tasks_blocked()
        lock.release("a")
        assert lock.holder == "b"
        b.cancel()
        with pytest.raises(asyncio.CancelledError):
            await b
        assert lock.holder is None and graph.edges() == {}


@pytest.mark.anyio
async def test_lock_cycle_and_reentry_raise_wait_cycle() -> None:
    graph = WaitGraph()
    l1, l2 = Lock("l1", waits=graph), Lock("l2", waits=graph)
    with anyio.fail_after(GUARD):
        await l1.take("a")
        await l2.take("b")
        async with anyio.create_task_group() as tg:
            tg.start_soon(l2.take, "a")  # a waits on b
            await anyio.wait_all_tasks_blocked()
            with pytest.raises(WaitCycle, match="b -> a -> b"):
                await l1.take("b")  # b would wait on a: deadlock, refused
            assert l1.waiting == [] and graph.edges() == {("a", "b"): 1}
            with pytest.raises(WaitCycle, match="a -> a"):
                await l1.take("a")  # not re-entrant
            l2.release("b")
        assert l2.holder == "a"
        l2.release("a")
        l1.release("a")
        assert graph.edges() == {}


@pytest.mark.anyio
async def test_misuse_is_named() -> None:
    lock = Lock("l", waits=WaitGraph())
    with pytest.raises(ActorError, match="'x' cannot release lock 'l': it is not held"):
        lock.release("x")
    await lock.take("a")
    with pytest.raises(ActorError, match="'x' cannot release lock 'l': it is held by 'a'"):
        lock.release("x")
    with pytest.raises(ActorError, match="no wait graph"):
        await Lock("bare").take("a")
    with pytest.raises(TypeError, match="Actor or an agent name"):
        await lock.take(3)  # type: ignore[arg-type]
