"""Actors: dispatch, tell/ask, crash isolation, waits and priority inheritance."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Iterator

import anyio
import msgspec
import pytest

from runtime.actors import Actor, handler
from runtime.system import ActorSystem
from runtime.errors import ActorCrashed, ActorError, AskTimeout, UnhandledMessage, WaitCycle
from runtime.bus import EventBus
from runtime.events import AgentCrashed, Event, Inherited, Restored, read_events
from runtime.priority import BACKGROUND, FOREGROUND

GUARD = 10  # seconds: a hang guard, never a threshold


class Ping(msgspec.Struct, tag=True):
    n: int = 0


class Pong(msgspec.Struct, tag=True):
    n: int


class Boom(msgspec.Struct, tag=True):
    why: str = "boom"


class Never(msgspec.Struct, tag=True):
    pass


class Note(msgspec.Struct, tag=True):
    pass


class TellTwice(msgspec.Struct, tag=True):
    to: str


class Forward(msgspec.Struct, tag=True):
    to: str
    msg: Ping | Forward | TellTwice


class Echo(Actor):
    def __init__(self, name: str, priority: int = BACKGROUND, **kw) -> None:
        super().__init__(name, priority, **kw)
        self.seen: list[int] = []

    @handler
    async def ping(self, msg: Ping) -> Pong:
        self.seen.append(msg.n)
        return Pong(msg.n + 1)

    @handler
    async def boom(self, msg: Boom) -> None:
        raise ValueError(msg.why)


class Relay(Actor):
    """Asks whoever a Forward names, from inside a handler."""

    def __init__(self, name: str, priority: int = BACKGROUND, **kw) -> None:
        super().__init__(name, priority, **kw)
        self.entered = anyio.Event()
        self.release = anyio.Event()

    @handler
    async def forward(self, msg: Forward) -> object:
        return await self.ask(msg.to, msg.msg, timeout=GUARD)

    @handler
    async def ping(self, msg: Ping) -> Pong:
        self.entered.set()
        await self.release.wait()
        return Pong(msg.n)


class Teller(Relay):
    notes = 0

    @handler
    async def tell_twice(self, msg: TellTwice) -> None:
        await self.tell(msg.to, Note())
        await self.tell(msg.to, Note())

    @handler
    async def note(self, msg: Note) -> None:
        self.notes += 1


class Silent(Actor):
    @handler
    async def never(self, msg: Never) -> None:
        await anyio.sleep_forever()


def events(bus: EventBus, kind: type) -> list:
    """Every event of that name emitted so far, from the bus's JSON-lines log."""
    return [e for e in read_events(bus.log_path) if isinstance(e, kind)]


@pytest.fixture
def bus(tmp_path: Path) -> Iterator[EventBus]:
    bus = EventBus(clock=lambda: 0.0)
    bus.log_path = bus.log_to_file(tmp_path / "events.jsonl")
    yield bus
    bus.close()


@pytest.mark.anyio
async def test_ask_and_tell_in_order(bus: EventBus) -> None:
    with anyio.fail_after(GUARD):
        async with ActorSystem(bus) as system:
            echo = Echo("echo", mailbox_size=2)
            ref = await system.spawn(echo)
            assert await ref.ask(Ping(1)) == Pong(2)
            for n in range(10):  # more than the mailbox holds: tell waits for room
                await ref.tell(Ping(n))
            await system.wait_idle()
            assert echo.seen == [1, *range(10)]
            sink = Echo("sink", mailbox_size=math.inf)
            await system.spawn(sink)
            for n in range(1000):
                await sink.ref.tell(Ping(n))
            assert sink.seen == []  # no tell ever waited for room (so sink never ran)
            await system.wait_idle()
            assert sink.seen == list(range(1000))
            assert system.ref("echo") == ref and ref.alive


@pytest.mark.anyio
async def test_handler_error_goes_to_asker_and_actor_survives(bus: EventBus) -> None:
    with anyio.fail_after(GUARD):
        async with ActorSystem(bus) as system:
            ref = await system.spawn(Echo("echo"))
            with pytest.raises(ValueError, match="bad review"):
                await ref.ask(Boom("bad review"))
            assert await ref.ask(Ping(5)) == Pong(6)
            assert events(bus, AgentCrashed) == []


@pytest.mark.anyio
async def test_told_error_is_logged(bus: EventBus, caplog: pytest.LogCaptureFixture) -> None:
    with anyio.fail_after(GUARD):
        async with ActorSystem(bus) as system:
            ref = await system.spawn(Echo("echo"))
            with caplog.at_level(logging.ERROR, logger="runtime.system"):
                await ref.tell(Boom("lost"))
                await system.wait_idle()
            assert "boom() failed on a told Boom" in caplog.text
            assert await ref.ask(Ping(0)) == Pong(1)


@pytest.mark.anyio
async def test_unhandled_message_names_type_and_handlers(bus: EventBus, caplog: pytest.LogCaptureFixture) -> None:
    with anyio.fail_after(GUARD):
        async with ActorSystem(bus) as system:
            ref = await system.spawn(Echo("echo"))
            with pytest.raises(UnhandledMessage) as info:
                await ref.ask(Never())
            text = str(info.value)
            assert "'echo'" in text and "Never" in text and "Boom, Ping" in text
            with caplog.at_level(logging.ERROR, logger="runtime.system"):
                await ref.tell(Never())
            assert "no handler for Never" in caplog.text
            with pytest.raises(TypeError, match="msgspec.Struct"):
                await ref.ask("hello")  # type: ignore[arg-type]
            with pytest.raises(ActorError, match="no actor named 'nobody'"):
                await system.ask("nobody", Ping())


@pytest.mark.anyio
async def test_ask_timeout_names_target_and_cleans_up(bus: EventBus) -> None:
    with anyio.fail_after(GUARD):
        async with ActorSystem(bus) as system:
            silent = await system.spawn(Silent("silent"))
            await system.spawn(Echo("asker"))
            with pytest.raises(AskTimeout, match="'silent' to Never"):
                await silent.ask(Never(), timeout=0.01, sender="asker")
            assert system.waits.edges() == {}
            assert system._cells["silent"].pending == {}


def test_handler_table_is_checked_when_the_class_is_made() -> None:
    with pytest.raises(TypeError, match="both a\\(\\) and b\\(\\) handle Ping"):

        class Twice(Actor):
            @handler
            async def a(self, msg: Ping) -> None: ...

            @handler
            async def b(self, msg: Ping | Pong) -> None: ...

    with pytest.raises(TypeError, match="msgspec.Struct types"):

        class NotStruct(Actor):
            @handler
            async def a(self, msg: int) -> None: ...

    with pytest.raises(TypeError, match="async def"):
        handler(lambda self, msg: None)

    class Both(Echo):
        @handler
        async def either(self, msg: Never | Pong) -> str:  # a union takes both
            return type(msg).__name__

        @handler
        async def ping(self, msg: Ping) -> Pong:  # overrides Echo's
            return Pong(-1)

    assert Both._dispatch == {Ping: "ping", Boom: "boom", Never: "either", Pong: "either"}


@pytest.mark.anyio
async def test_union_handler_and_override(bus: EventBus) -> None:
    class Both(Echo):
        @handler
        async def either(self, msg: Never | Pong) -> str:
            return type(msg).__name__

    with anyio.fail_after(GUARD):
        async with ActorSystem(bus) as system:
            ref = await system.spawn(Both("both"))
            assert await ref.ask(Never()) == "Never"
            assert await ref.ask(Pong(1)) == "Pong"
            assert await ref.ask(Ping(1)) == Pong(2)


class CrashInRun(Actor):
    def __init__(self, name: str, go: anyio.Event) -> None:
        super().__init__(name)
        self.go = go
        self.stopped = False

    async def run(self) -> None:
        await self.go.wait()
        raise RuntimeError("main loop fell over")

    @handler
    async def never(self, msg: Never) -> None:
        await anyio.sleep_forever()

    async def on_stop(self) -> None:
        self.stopped = True


@pytest.mark.anyio
async def test_crash_in_run_is_isolated(bus: EventBus) -> None:
    with anyio.fail_after(GUARD):
        async with ActorSystem(bus) as system:
            stopped: list[str] = []
            system.on_actor_stopped.append(stopped.append)
            go = anyio.Event()
            victim = CrashInRun("victim", go)
            await system.spawn(victim)
            echo = await system.spawn(Echo("echo"))
            errors: list[BaseException] = []

            async def pending_ask() -> None:
                try:
                    await system.ask("victim", Never(), sender="echo")
                except ActorCrashed as exc:
                    errors.append(exc)

            async with anyio.create_task_group() as tg:
                tg.start_soon(pending_ask)
                await anyio.wait_all_tasks_blocked()
                assert system.waits.holders_of("echo") == {"victim"}
                go.set()
            await system.join("victim")

            assert len(errors) == 1 and "'victim' crashed (RuntimeError: main loop fell over)" in str(errors[0])
            assert "before replying to Never" in str(errors[0])
            [crash] = events(bus, AgentCrashed)
            assert (crash.agent, crash.reason) == ("victim", "RuntimeError: main loop fell over")
            assert victim.stopped and stopped == ["victim"]
            assert system.waits.edges() == {}
            with pytest.raises(ActorCrashed, match="'victim' has crashed"):
                await system.ask("victim", Never())
            with pytest.raises(ActorCrashed, match="'victim'"):
                await system.tell("victim", Never())
            assert await echo.ask(Ping(1)) == Pong(2)  # the rest carries on
            assert system.names() == ["echo"]
            # The name is free again.
            await system.spawn(Echo("victim"))
            assert await system.ask("victim", Ping(0)) == Pong(1)


class BadStart(Echo):
    async def on_start(self) -> None:
        raise OSError("no model file")

    async def on_stop(self) -> None:
        self.seen.append(-1)


@pytest.mark.anyio
async def test_crash_in_on_start(bus: EventBus) -> None:
    with anyio.fail_after(GUARD):
        async with ActorSystem(bus) as system:
            bad = BadStart("bad")
            ref = await system.spawn(bad)
            assert not ref.alive and bad.seen == [-1]  # on_stop ran
            with pytest.raises(ActorCrashed, match="'bad' has crashed \\(OSError: no model file\\)"):
                await ref.ask(Ping())
            [crash] = events(bus, AgentCrashed)
            assert crash.reason == "OSError: no model file"
            assert await (await system.spawn(Echo("ok"))).ask(Ping(0)) == Pong(1)


class Recorder(Actor):
    def __init__(self, name: str, log: list[str], priority: int = BACKGROUND) -> None:
        super().__init__(name, priority)
        self.log = log

    async def on_start(self) -> None:
        self.log.append(f"start {self.name}")

    async def on_stop(self) -> None:
        await anyio.sleep(0)  # on_stop may await even while its actor is being cancelled
        self.log.append(f"stop {self.name}")

    async def run(self) -> None:
        await anyio.sleep_forever()

    @handler
    async def never(self, msg: Never) -> None:
        await anyio.sleep_forever()


@pytest.mark.anyio
async def test_leaving_the_system_stops_everything(bus: EventBus) -> None:
    log: list[str] = []
    errors: list[BaseException] = []
    hooked: list[str] = []
    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:
            async with ActorSystem(bus) as system:
                system.on_actor_stopped.append(hooked.append)
                for name in ("a", "b"):
                    await system.spawn(Recorder(name, log))

                async def ask_forever() -> None:
                    try:
                        await system.ask("a", Never(), sender="b")
                    except ActorCrashed as exc:
                        errors.append(exc)

                tg.start_soon(ask_forever)
                await anyio.wait_all_tasks_blocked()
            # leaving the system fails the ask in flight rather than leaving it hanging
        assert sorted(log) == ["start a", "start b", "stop a", "stop b"]
        assert sorted(hooked) == ["a", "b"]
        assert len(errors) == 1 and "'a' stopped before replying to Never" in str(errors[0])
        assert system.waits.edges() == {}
        assert events(bus, AgentCrashed) == []


@pytest.mark.anyio
async def test_system_body_error_still_stops_actors(bus: EventBus) -> None:
    log: list[str] = []
    with anyio.fail_after(GUARD):
        with pytest.raises(KeyError):
            async with ActorSystem(bus) as system:
                await system.spawn(Recorder("a", log))
                raise KeyError("body failed")
    assert log == ["start a", "stop a"]


@pytest.mark.anyio
async def test_stop_one_actor(bus: EventBus) -> None:
    log: list[str] = []
    with anyio.fail_after(GUARD):
        async with ActorSystem(bus) as system:
            await system.spawn(Recorder("a", log))
            await system.spawn(Recorder("b", log))
            await system.stop("a")
            await system.stop("a")  # again: nothing
            assert log == ["start a", "start b", "stop a"]
            assert system.names() == ["b"]
            with pytest.raises(ActorCrashed, match="'a' has stopped"):
                await system.ask("a", Never())
            with pytest.raises(ActorError, match="already running"):
                await system.spawn(Echo("b"))


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


@pytest.mark.anyio
async def test_bad_spawns_are_named(bus: EventBus) -> None:
    class Forgot(Actor):
        def __init__(self) -> None:
            pass

    with pytest.raises(ActorError, match="not running"):
        await ActorSystem(bus).spawn(Echo("early"))
    with pytest.raises(ValueError, match="non-empty name"):
        Echo("")
    async with ActorSystem(bus) as system:
        with pytest.raises(TypeError, match="super\\(\\).__init__"):
            await system.spawn(Forgot())
        echo = Echo("once")
        await system.spawn(echo)
        with pytest.raises(ActorError, match="already spawned"):
            await system.spawn(echo)
