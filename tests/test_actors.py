"""Actors: dispatch, tell and ask, handler tables, and what a bad spawn is told.
(Their lives, crashes and stops: test_actor_lives.py; their waits and lent
priority: test_actor_waits.py.)"""

from __future__ import annotations

import logging
import math

import anyio
import pytest
from actor_kit import GUARD, Boom, Echo, Never, Ping, Pong, Silent, events

from runtime.actors.actor import Actor, handler
from runtime.actors.system import ActorSystem
from runtime.errors import ActorError, AskTimeout, UnhandledMessage
from runtime.events.bus import EventBus
from runtime.events.kinds import AgentCrashed


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
            with caplog.at_level(logging.ERROR, logger="runtime.actors.system"):
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
            with caplog.at_level(logging.ERROR, logger="runtime.actors.system"):
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
