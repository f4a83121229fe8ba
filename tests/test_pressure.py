"""KV memory pressure through the GPU owner: every policy under a pool far too small
for its turns, with the content-checking KVEngine (tests/kv_engine.py) standing in
for the device, so a lost or stale block shows as a wrong token."""

from __future__ import annotations

import anyio
import pytest
from kv_engine import KVEngine, reference_output

from runtime.events.kinds import Ended, Event, Finished, Preempted, Recomputed, SwappedIn, SwappedOut
from runtime.scheduling.turns import Policy
from swarm import BACKGROUND, FOREGROUND, Agent, Swarm


def prompt_for(i: int) -> list[int]:
    return [3 + (i * 7 + j) % 60 for j in range(9 + i % 11)]


async def pressure_run(
    policy: str, engine, *, swap_blocks=None, bg: int = 16, fg: int = 12, max_tokens: int = 14
) -> tuple[dict, list[Event]]:
    """`bg` background turns, then `fg` foreground ones arriving a few steps apart.
    Returns each agent's tokens (or its error) and every event."""
    events: list[Event] = []
    results: dict[str, object] = {}
    async with Swarm(engine, slots=8, policy=policy, step_tokens=16, swap_blocks=swap_blocks) as s:
        sub = s.bus.subscribe(max_buffer=10**9)

        async def record() -> None:
            async for e in sub:
                events.append(e)

        async def turn(name: str, priority: int, i: int) -> None:
            agent = await s.spawn(Agent(name, priority))
            try:
                async with agent.generate(prompt_for(i), max_tokens=max_tokens, ignore_eos=True) as t:
                    async for _ in t:
                        pass
                results[name] = t.tokens
            except Exception as exc:  # noqa: BLE001 - the test reports what went wrong
                results[name] = exc

        async with anyio.create_task_group() as tg:
            tg.start_soon(record)
            async with anyio.create_task_group() as turns:
                for i in range(bg):
                    turns.start_soon(turn, f"bg{i}", BACKGROUND, i)
                for i in range(bg, bg + fg):
                    # Arrive one engine step apart, counted, not timed.
                    start = s.owner.scheduler.step
                    while s.owner.scheduler.step < start + 2:
                        await anyio.sleep(0)
                    turns.start_soon(turn, f"fg{i}", FOREGROUND, i)
            tg.cancel_scope.cancel()
    return results, events


@pytest.mark.parametrize("policy", [p.value for p in Policy])
@pytest.mark.parametrize("swap_blocks", [None, 6])
@pytest.mark.asyncio
async def test_memory_pressure_loses_nothing_under_any_policy(policy: str, swap_blocks) -> None:
    engine = KVEngine(num_blocks=40, block_size=4)
    with anyio.fail_after(60):
        results, events = await pressure_run(policy, engine, swap_blocks=swap_blocks)
    for name, got in results.items():
        i = int(name[2:])
        assert got == reference_output(prompt_for(i), 14), f"{policy}: {name} got {got!r}"
    ends = [e for e in events if isinstance(e, Ended)]
    assert len(ends) == 28 and {type(e) for e in ends} == {Finished}
    assert not engine.host  # no host copy left behind


@pytest.mark.parametrize("fault", ["swap_out", "swap_in"])
@pytest.mark.asyncio
async def test_a_failed_kv_move_is_not_reported_as_made_and_its_turn_recomputes(fault: str) -> None:
    engine = KVEngine(num_blocks=40, block_size=4)
    engine.fail_next(fault)
    engine.fail_next(fault, why="a second one")
    with anyio.fail_after(60):
        results, events = await pressure_run("swap", engine)
    assert len(engine.failed) == 2
    named = lambda kind: [e for e in events if isinstance(e, kind)]  # noqa: E731
    # The log says exactly the moves that happened.
    assert len(named(SwappedOut)) == engine.done["swap_out"]
    assert len(named(SwappedIn)) == engine.done["swap_in"]
    for name, got in results.items():
        assert got == reference_output(prompt_for(int(name[2:])), 14), f"{name} got {got!r}"
    assert {type(e) for e in events if isinstance(e, Ended)} == {Finished}
    assert named(Recomputed) and not engine.host


@pytest.fixture(scope="module")
def unpressed(tiny_model) -> dict:
    """The tiny model's greedy outputs with room for every turn at once."""
    from gpu.engine import OpenCLEngine

    results, _ = anyio.run(pressure_run, "resident", OpenCLEngine(tiny_model, num_blocks=256, block_size=16))
    return results


@pytest.mark.parametrize("policy", ["recompute", "swap", "resident"])
@pytest.mark.asyncio
async def test_greedy_outputs_under_pressure_equal_those_without_on_the_opencl_engine(tiny_model, unpressed, policy: str) -> None:
    from gpu.engine import OpenCLEngine

    engine = OpenCLEngine(tiny_model, num_blocks=16, block_size=16)  # 8 slots want ~20
    with anyio.fail_after(240):
        results, events = await pressure_run(policy, engine, bg=16, fg=12)
    assert any(isinstance(e, Preempted) and e.reason == "memory" for e in events) or any(
        isinstance(e, (SwappedOut, SwappedIn, Recomputed)) for e in events
    )
    assert results == unpressed
    assert not engine.kv.swapped_turns()
