"""An actor's life in the system: a crash in run() or on_start() is isolated and
reported once, leaving the system stops everyone, one actor can be stopped."""

from __future__ import annotations

import anyio
import pytest
from actor_kit import GUARD, Echo, Never, Ping, Pong, events

from runtime.actors.actor import Actor, handler
from runtime.actors.system import ActorSystem
from runtime.errors import ActorCrashed, ActorError
from runtime.events.bus import EventBus
from runtime.events.kinds import AgentCrashed
from runtime.scheduling.priority import BACKGROUND


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
