"""Churn: agents come and go by the thousand and the swarm's own state does not
grow with them (actor records, wait-graph entries, priority loans, reply
channels, step history). Counted, not timed."""

from __future__ import annotations

import gc
import tracemalloc

import anyio
import msgspec
import pytest
from kv_engine import KVEngine

from runtime.owner.owner import STEP_HISTORY
from swarm import BACKGROUND, FOREGROUND, Agent, Swarm, handler

CHURN = 2000  # 4,000 agents: helpers and askers


class Q(msgspec.Struct):
    n: int


class Helper(Agent):
    @handler
    async def answer(self, msg: Q) -> str:
        return await self.complete([3, msg.n % 50 + 3], max_tokens=2, ignore_eos=True)


def held(s: Swarm) -> dict[str, int]:
    return {
        "actor records": len(s.system._cells),
        "wait-graph bases": len(s.system.waits._base),
        "wait-graph parts": len(s.system.waits._parts),  # (lent priorities are derived from them)
        "priority loans": len(s.owner.scheduler.priorities.lent),
        "reply channels": len(s.owner.replies),
        "live turns": len(s.owner.scheduler.turns),
    }


@pytest.mark.asyncio
async def test_spawning_and_stopping_thousands_of_agents_leaves_nothing_behind() -> None:
    figures = {}
    with anyio.fail_after(600):
        async with Swarm(KVEngine(num_blocks=64, block_size=4), slots=4) as s:
            baseline = held(s)
            tracemalloc.start()
            for i in range(CHURN):
                if i == CHURN // 2:  # past the first 1,024 finished actors, which are remembered
                    gc.collect()
                    before = tracemalloc.get_traced_memory()[0]
                # Every other agent asks a helper (a priority loan while it waits), and
                # half of them are stopped mid-turn.
                helper = await s.spawn(Helper(f"helper{i}"))
                asker = await s.spawn(Agent(f"agent{i}", FOREGROUND if i % 2 else BACKGROUND))
                if i % 2:
                    assert await asker.ask(helper.name, Q(i), timeout=60)
                else:
                    async with asker.generate([5, 6, 7], max_tokens=100, ignore_eos=True) as turn:
                        async for _ in turn:
                            break  # leave mid-turn: the turn is cancelled
                await s.system.stop(asker.name)
                await s.system.stop(helper.name)
            await s.system.wait_idle()
            with anyio.fail_after(30):
                while s.owner.scheduler.turns:  # the last cancel lands at the next boundary
                    await anyio.sleep(0.001)
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
            tracemalloc.stop()
            after = held(s)
            figures = dict(agents=2 * CHURN, bytes_per_1000_agents=grown / CHURN * 1000, **after)
            print("churn:", figures)
            assert after == baseline, figures
            assert len(s.system._finished) <= 1024
            assert len(s.owner.step_seconds) <= STEP_HISTORY
            # Python's allocator keeps some slack; 6 MB per 1,000 agents was the leak.
            assert figures["bytes_per_1000_agents"] < 100_000
            assert s.system.is_alive(s.owner.name)
