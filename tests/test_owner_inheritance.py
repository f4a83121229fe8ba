"""Priority inheritance through the GPU owner, end to end on the timing-model
engine: an ask or a lock lends the waiter's priority to the turns that serve it,
and only to those. Asserted in decode steps read from the event stream."""

from __future__ import annotations

import anyio
import msgspec
import pytest
from test_owner import LONG, busy, swarm

from runtime.events.kinds import Finished, Inherited, Preempted, Queued, Restored
from swarm import BACKGROUND, FOREGROUND, Agent, Lock, handler


class Review(msgspec.Struct):
    code: str


class Reviewer(Agent):
    @handler
    async def review(self, msg: Review) -> str:
        return await self.complete([7, 7, 7], max_tokens=30, ignore_eos=True)


class Asker(Agent):
    async def run(self) -> None:
        self.verdict = await self.ask("reviewer", Review("x = 1"), timeout=30)


@pytest.mark.anyio
async def test_a_foreground_ask_lends_its_priority_to_the_reviewers_turn():
    with anyio.fail_after(30):
        async with swarm(slots=1) as s:
            rec = await busy(s, "tests")
            await s.spawn(Reviewer("reviewer"))
            await s.spawn(Asker("pair", FOREGROUND))
            lent = await rec.until(lambda e: isinstance(e, Inherited))
            assert (lent.agent, lent.priority, lent.base_priority, lent.by_agent) == ("reviewer", FOREGROUND, BACKGROUND, "pair")
            pre = await rec.until(lambda e: isinstance(e, Preempted))
            assert (pre.agent, pre.by_agent, pre.by_priority) == ("tests", "reviewer", FOREGROUND)
            await rec.until(lambda e: isinstance(e, Finished) and e.agent == "reviewer")
            restored = await rec.until(lambda e: isinstance(e, Restored))
            assert (restored.agent, restored.priority) == ("reviewer", BACKGROUND)


class Holder(Agent):
    def __init__(self, name: str, lock) -> None:
        super().__init__(name)
        self.lock = lock

    async def run(self) -> None:
        async with self.lock(self):
            await self.complete([4, 4], max_tokens=20, ignore_eos=True)


class Waiter(Agent):
    def __init__(self, name: str, lock) -> None:
        super().__init__(name, FOREGROUND)
        self.lock = lock

    async def run(self) -> None:
        async with self.lock(self):
            self.got_it = True


@pytest.mark.anyio
async def test_waiting_on_a_lock_lends_priority_to_its_holders_turn():
    with anyio.fail_after(30):
        async with swarm(slots=1) as s:
            rec, lock = await busy(s, "busy"), Lock("workspace")
            await s.spawn(Holder("docs", lock))
            await rec.until(lambda e: isinstance(e, Queued) and e.agent == "docs")
            await s.spawn(Waiter("pair", lock))
            lent = await rec.until(lambda e: isinstance(e, Inherited))
            assert (lent.agent, lent.priority, lent.by_agent) == ("docs", FOREGROUND, "pair")
            pre = await rec.until(lambda e: isinstance(e, Preempted))
            assert (pre.agent, pre.by_agent) == ("busy", "docs")
            restored = await rec.until(lambda e: isinstance(e, Restored))
            assert restored.agent == "docs"
            finished = [e for e in rec.events if isinstance(e, Finished) and e.agent == "docs"]
            assert finished and finished[0].step <= restored.step


class BusyReviewer(Agent):
    """Reviews on request, and does its own long background review meanwhile."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.started = anyio.Event()

    async def run(self) -> None:
        async with self.generate([5, 5], max_tokens=LONG, ignore_eos=True) as turn:
            async for _ in turn:
                self.started.set()
                await anyio.sleep(0)

    @handler
    async def review(self, msg: Review) -> str:
        return await self.complete([7, 7, 7], max_tokens=5, ignore_eos=True)


@pytest.mark.anyio
async def test_an_ask_lifts_the_turn_serving_it_not_the_holders_own_work():
    with anyio.fail_after(30):
        async with swarm(slots=2) as s:
            rec = await busy(s, "tests")
            reviewer = await s.spawn(BusyReviewer("reviewer"))
            await reviewer.started.wait()
            await s.spawn(Asker("pair", FOREGROUND))
            lent = await rec.until(lambda e: isinstance(e, Inherited))
            assert (lent.agent, lent.by_agent, lent.request) == ("reviewer", "pair", "Review for pair")
            # The handler's turn runs at the asker's priority and displaces the
            # lowest turn there is: the reviewer's own review, still at background.
            pre = await rec.until(lambda e: isinstance(e, Preempted))
            assert (pre.agent, pre.priority, pre.by_agent, pre.by_priority) == ("reviewer", BACKGROUND, "reviewer", FOREGROUND)
            assert s.owner.scheduler.turns[pre.turn].priority == BACKGROUND
            await rec.until(lambda e: isinstance(e, Finished) and e.agent == "reviewer")
            await rec.until(lambda e: isinstance(e, Restored))
            assert not any(isinstance(e, Preempted) and e.agent == "tests" for e in rec.events)


class LockAndOwnWork(Agent):
    """Holds a lock for one turn while a turn of its own runs outside it."""

    def __init__(self, name: str, lock) -> None:
        super().__init__(name)
        self.lock = lock
        self.started = anyio.Event()

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.own_work)
            await self.started.wait()
            async with self.lock(self):
                self.inside = self.turn_priority
                await self.complete([4, 4], max_tokens=5, ignore_eos=True)
            tg.cancel_scope.cancel()

    async def own_work(self) -> None:
        self.outside = self.turn_priority
        async with self.generate([5, 5], max_tokens=LONG, ignore_eos=True) as turn:
            async for _ in turn:
                self.started.set()
                await anyio.sleep(0)


@pytest.mark.anyio
async def test_a_lock_lifts_the_holders_critical_section_only():
    with anyio.fail_after(30):
        async with swarm(slots=2) as s:
            rec, lock = await busy(s, "busy"), Lock("workspace")
            docs = await s.spawn(LockAndOwnWork("docs", lock))
            await rec.until(lambda e: isinstance(e, Queued) and e.agent == "docs")
            await rec.until(lambda e: isinstance(e, Queued) and e.agent == "docs")  # the critical section's turn, no slot
            await s.spawn(Waiter("pair", lock))
            lent = await rec.until(lambda e: isinstance(e, Inherited))
            assert (lent.agent, lent.request) == ("docs", "lock workspace for pair")
            pre = await rec.until(lambda e: isinstance(e, Preempted))
            assert (pre.agent, pre.priority, pre.by_agent, pre.by_priority) == ("docs", BACKGROUND, "docs", FOREGROUND)
            await s.join(docs)
            assert docs.outside == BACKGROUND
            assert not any(isinstance(e, Preempted) and e.agent == "busy" for e in rec.events)
