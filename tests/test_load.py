"""Load in virtual time: 1,000 agents and 10,000 turns through the real GPU owner
and scheduler, with the content-checking KVEngine under memory pressure and a
clock that advances only when the engine steps. Every turn must end exactly
once, every finished greedy turn must say exactly what it says alone, and no KV
block or host copy may be left. Nothing here is timed: the figures printed are
for the record (pytest -s)."""

from __future__ import annotations

import random
import time
from collections import Counter

import anyio
import pytest
from kv_engine import KVEngine, reference_output

from runtime.events.kinds import Ended, Finished
from swarm import BACKGROUND, FOREGROUND, Agent, Swarm

AGENTS = 1000
TURNS_EACH = 10
STEP_S = 0.025  # virtual seconds per engine step


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class SteppedEngine(KVEngine):
    """Each step moves the virtual clock on by STEP_S."""

    def __init__(self, clock: Clock, **kw) -> None:
        super().__init__(**kw)
        self.clock = clock

    def step(self, batch, abandon=None):
        self.clock.now += STEP_S
        return super().step(batch)


class Worker(Agent):
    def __init__(self, name: str, priority: int, seed: int, results: dict, turns: int) -> None:
        super().__init__(name, priority)
        self.rng = random.Random(seed)
        self.results = results
        self.turns = turns

    async def run(self) -> None:
        for k in range(self.turns):
            prompt = [self.rng.randrange(3, 64) for _ in range(self.rng.randint(1, 12))]
            max_tokens = self.rng.randint(1, 10)
            async with self.generate(prompt, max_tokens=max_tokens, ignore_eos=True) as turn:
                async for _ in turn:
                    pass
            self.results[(self.name, k)] = (prompt, max_tokens, turn.tokens)


# The default policy carries the full load; the others the same agents, fewer turns each.
@pytest.mark.parametrize("policy, turns_each", [("resident", TURNS_EACH), ("swap", 2), ("recompute", 2)])
@pytest.mark.asyncio
async def test_a_thousand_agents_and_ten_thousand_turns_in_virtual_time(policy: str, turns_each: int) -> None:
    clock = Clock()
    engine = SteppedEngine(clock, num_blocks=160, block_size=4)  # 32 slots want up to 192
    results: dict = {}
    ends: Counter[int] = Counter()
    kinds: Counter[str] = Counter()
    started = time.perf_counter()
    with anyio.fail_after(900):
        async with Swarm(engine, slots=32, policy=policy, step_tokens=64, clock=clock) as s:
            sub = s.bus.subscribe(max_buffer=10**9)
            workers = []
            for i in range(AGENTS):
                priority = FOREGROUND if i % 50 == 0 else BACKGROUND + (i % 3)
                workers.append(await s.spawn(Worker(f"w{i}", priority, i, results, turns_each)))
            for w in workers:
                await s.join(w)
            assert s.system.is_alive(s.owner.name)
            assert s.owner.scheduler.pool.num_free == engine.num_blocks and not s.owner.scheduler.turns
            assert s.owner.scheduler.swapped_blocks == 0 and not engine.host
            steps = s.owner.scheduler.step
        async for e in sub:
            kinds[type(e).__name__] += 1
            if isinstance(e, Ended):
                ends[e.turn] += 1
                assert isinstance(e, Finished), e
    wall = time.perf_counter() - started
    assert len(results) == AGENTS * turns_each
    assert len(ends) == AGENTS * turns_each and set(ends.values()) == {1}
    for prompt, max_tokens, tokens in results.values():
        assert tokens == reference_output(prompt, max_tokens)
    print(
        f"\nload [{policy}]: {AGENTS} agents, {len(results)} turns, {steps} steps, {clock.now:.1f} virtual s, "
        f"{wall:.1f} wall s, preempted {kinds['Preempted']}, swapped out {kinds['SwappedOut']}, "
        f"recomputed {kinds['Recomputed']}"
    )
