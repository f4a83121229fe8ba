"""Errors carry their context, and the public API re-exports the whole tree."""

from __future__ import annotations

import inspect

import anyio
import msgspec
import pytest

import swarm
from runtime import errors
from runtime.actors.waits import WaitGraph
from runtime.scheduling.timing import TimingEngine
from swarm import Agent, Swarm


class Probe(msgspec.Struct):
    pass


def test_swarm_exports_every_error_in_the_tree() -> None:
    tree = {name for name, cls in vars(errors).items() if inspect.isclass(cls) and issubclass(cls, errors.SlotswarmError)}
    assert tree <= set(swarm.__all__)
    assert all(getattr(swarm, name) is getattr(errors, name) for name in tree)


def test_a_wait_cycle_names_its_chain() -> None:
    graph = WaitGraph()
    graph.wait("a", "b")
    graph.wait("b", "c")
    with pytest.raises(errors.WaitCycle) as caught:
        graph.wait("c", "a")
    assert caught.value.chain == ["c", "a", "b", "c"] and caught.value.agent == "c"


@pytest.mark.anyio
async def test_a_cancelled_turn_says_whose_it_was_and_why() -> None:
    with anyio.fail_after(30):
        async with Swarm(TimingEngine(), slots=1) as s:
            agent = await s.spawn(Agent("a"))
            async with agent.generate([1], max_tokens=10**6, ignore_eos=True) as turn:
                with pytest.raises(errors.TurnCancelled) as caught:
                    async for _ in turn:
                        await s.client.cancel(turn.id, "told to stop")
    assert (caught.value.turn, caught.value.agent, caught.value.reason) == (turn.id, "a", "told to stop")


@pytest.mark.anyio
async def test_asking_a_stopped_actor_names_it() -> None:
    with anyio.fail_after(30):
        async with Swarm(TimingEngine(), slots=1) as s:
            await s.spawn(Agent("gone"))
            await s.system.stop("gone")
            with pytest.raises(errors.ActorCrashed) as caught:
                await s.system.tell("gone", Probe())
    assert caught.value.agent == "gone" and caught.value.reason is None
