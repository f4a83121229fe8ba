"""Waits between actors: a cycle fails at once, a full mailbox is a wait too, and
priority is lent along an ask chain and given back when the waits end."""

from __future__ import annotations

import anyio
import pytest
from actor_kit import GUARD, Echo, Forward, Never, Ping, Pong, Relay, Silent, Teller, TellTwice, events

from runtime.actors.system import ActorSystem
from runtime.errors import WaitCycle
from runtime.events.bus import EventBus
from runtime.events.kinds import Inherited, Restored
from runtime.scheduling.priority import BACKGROUND, FOREGROUND


@pytest.mark.anyio
async def test_wait_cycles_fail_fast(bus: EventBus) -> None:
    with anyio.fail_after(GUARD):
        async with ActorSystem(bus) as system:
            relays = [Relay(name) for name in "abc"]
            for relay in relays:
                await system.spawn(relay)
            # a asks b, b asks a back: would deadlock, so b's ask fails and a gets the error.
            with pytest.raises(WaitCycle, match="b -> a -> b"):
                await system.ask("a", Forward("b", Forward("a", Ping())))
            # a -> b -> c -> a
            with pytest.raises(WaitCycle, match="c -> a -> b -> c"):
                await system.ask("a", Forward("b", Forward("c", Forward("a", Ping()))))
            # asking yourself from a handler
            with pytest.raises(WaitCycle, match="a -> a"):
                await system.ask("a", Forward("a", Ping()))
            assert system.waits.edges() == {}
            # and everyone still works
            for relay in relays:
                relay.release.set()
                assert await relay.ref.ask(Ping(3)) == Pong(3)


@pytest.mark.anyio
async def test_tell_into_a_full_mailbox_is_a_wait_too(bus: EventBus) -> None:
    with anyio.fail_after(GUARD):
        async with ActorSystem(bus) as system:
            a = Teller("a", mailbox_size=1)
            await system.spawn(a)
            await system.spawn(Teller("b"))
            # a's handler asks b; b tells a twice while a is busy: the first note
            # fills a's one-slot mailbox, the second would wait on a, who waits on b.
            with pytest.raises(WaitCycle, match="b -> a -> b"):
                await system.ask("a", Forward("b", TellTwice("a")))
            await system.wait_idle()
            assert a.notes == 1 and system.waits.edges() == {}


@pytest.mark.anyio
async def test_priority_inherited_along_an_ask_chain_and_restored(bus: EventBus) -> None:
    with anyio.fail_after(GUARD):
        async with ActorSystem(bus) as system:
            changes: list[tuple[str, int, int | None]] = []
            system.on_priority_change.append(lambda *change: changes.append(change))
            await system.spawn(Relay("fg", FOREGROUND))
            mid = Relay("mid", 3)
            await system.spawn(mid)
            low = Relay("low", BACKGROUND)
            await system.spawn(low)

            async with anyio.create_task_group() as tg:
                # fg asks mid, whose handler asks low, whose handler blocks.
                tg.start_soon(system.ask, "fg", Forward("mid", Forward("low", Ping(7))))
                await low.entered.wait()
                assert low.effective_priority == FOREGROUND
                assert mid.effective_priority == FOREGROUND
                assert system.waits.inherited_from("low") == "fg"
                low.release.set()
            assert (low.effective_priority, mid.effective_priority) == (BACKGROUND, 3)

            inherited = [(e.agent, e.priority, e.base_priority, e.by_agent) for e in events(bus, Inherited)]
            assert ("low", FOREGROUND, BACKGROUND, "fg") in inherited
            assert ("mid", FOREGROUND, 3, "fg") in inherited
            restored = {(e.agent, e.priority, e.base_priority) for e in events(bus, Restored)}
            assert restored == {("low", BACKGROUND, BACKGROUND), ("mid", 3, 3)}
            assert changes[-1][2] is None and {c[0] for c in changes} == {"mid", "low"}
            assert system.waits.edges() == {}


class AsksFromRun(Relay):
    """Its own run() asks `side` (a background chore) while its handlers serve others."""

    def __init__(self, name: str, side: str) -> None:
        super().__init__(name)
        self.side = side

    async def run(self) -> None:
        await self.ask(self.side, Ping(1), timeout=GUARD)


@pytest.mark.anyio
async def test_a_chain_lifts_what_the_handler_waits_on_not_what_its_agents_own_run_waits_on(bus: EventBus) -> None:
    with anyio.fail_after(GUARD):
        async with ActorSystem(bus) as system:
            await system.spawn(Relay("fg", FOREGROUND))
            side, low = Relay("side"), Relay("low")
            await system.spawn(side)
            await system.spawn(low)
            await system.spawn(AsksFromRun("mid", "side"))
            await side.entered.wait()  # mid's run() is waiting on side
            async with anyio.create_task_group() as tg:
                tg.start_soon(system.ask, "fg", Forward("mid", Forward("low", Ping(7))))
                await low.entered.wait()  # fg waits on mid's handler, which waits on low
                assert (system.waits.effective("mid"), low.effective_priority) == (FOREGROUND, FOREGROUND)
                assert side.effective_priority == BACKGROUND  # mid's own chore is not the fg's business
                low.release.set()
            side.release.set()
            assert not any(e.agent == "side" for e in events(bus, Inherited))


@pytest.mark.anyio
async def test_cancelled_ask_releases_its_wait(bus: EventBus) -> None:
    with anyio.fail_after(GUARD):
        async with ActorSystem(bus) as system:
            await system.spawn(Silent("silent"))
            asker = Echo("asker", FOREGROUND)
            await system.spawn(asker)
            async with anyio.create_task_group() as tg:
                tg.start_soon(asker.ask, "silent", Never())
                await anyio.wait_all_tasks_blocked()
                assert system.waits.effective("silent") == FOREGROUND
                tg.cancel_scope.cancel()
            assert system.waits.effective("silent") == BACKGROUND
            assert system.waits.edges() == {} and system._cells["silent"].pending == {}


@pytest.mark.anyio
async def test_changing_base_priority_updates_the_graph(bus: EventBus) -> None:
    with anyio.fail_after(GUARD):
        async with ActorSystem(bus) as system:
            echo = Echo("echo")
            await system.spawn(echo)
            echo.priority = FOREGROUND
            assert system.waits.effective("echo") == FOREGROUND == echo.effective_priority
