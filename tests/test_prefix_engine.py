"""With the prefix cache on, greedy outputs equal those with it off, on the real
engine (the tiny model and SmolLM2), through preemption, swap, recompute and
memory pressure: shared K/V is exactly the K/V a turn would have computed."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from gpu.engine import OpenCLEngine
from gpu.model.load import Model
from runtime.agent import Agent
from runtime.events.kinds import Admitted, Event, Finished, Preempted, Recomputed, SwappedIn, SwappedOut
from runtime.scheduling.blocks import BlockPool
from runtime.scheduling.priority import BACKGROUND, FOREGROUND
from runtime.scheduling.scheduler import Scheduler
from runtime.scheduling.turns import Copy, SchedulerConfig, SwapOut
from swarm import Swarm

BLOCKS = 20  # 320 positions: the host room (swap_blocks) runs out, so swap also drops and recomputes


def script(vocab: int) -> list[tuple]:
    """(step, name, priority, prompt, max_tokens): two background turns on a shared
    system prompt, a repeat of the first, a foreground turn that preempts the repeat
    and, once the first has finished, its agent's next turn over the conversation so
    far (prompt None: the first turn's prompt and output, then a new message)."""
    rng = np.random.default_rng(1)
    words = lambda n: rng.integers(3, vocab, n).tolist()  # noqa: E731
    system = words(40)
    first = system + words(30)
    return [
        (0, "first", BACKGROUND, first, 24),
        (0, "second", BACKGROUND, system + words(25), 24),
        (4, "repeat", BACKGROUND, first, 24),
        (6, "foreground", FOREGROUND, words(50), 12),
        (None, "follow-up", BACKGROUND, None, 12),
    ]


def run(engine: OpenCLEngine, policy: str, cache: bool) -> tuple[dict[str, list[int]], Counter, int]:
    """Every turn's output, the count of each event (and of blocks kept on swap-out),
    and the tokens reused from the cache."""
    events: list[Event] = []
    pool = BlockPool(BLOCKS, engine.block_size, namespace=engine.model_id)
    config = SchedulerConfig(slots=3, policy=policy, step_tokens=32, swap_blocks=4, prefix_cache=cache)
    sched = Scheduler(config, pool, emit=events.append)
    pending = script(engine.config.vocab_size)
    turns = {}
    extra = list(range(3, 13))
    kept = 0  # blocks swap-outs left on the device, shared
    copies = 0  # blocks given the rows a cached block shares with a prompt
    while pending or any(not t.done for t in turns.values()):
        for item in list(pending):
            at, name, priority, prompt, max_tokens = item
            if at is None and turns["first"].done:
                prompt = turns["first"].prompt + turns["first"].output + extra
            elif at is None or at > sched.step:
                continue
            turns[name] = sched.submit(name, priority, prompt, max_tokens, float(sched.step), ignore_eos=True)
            pending.remove(item)
        plan = sched.schedule(float(sched.step))
        for move in plan.moves:  # in order, as the GPU owner does
            move.apply(engine)
            kept += len(sched.turns[move.turn].swap_kept) if isinstance(move, SwapOut) else 0
            copies += isinstance(move, Copy)
        tokens = engine.step(plan.works) if plan.works else []
        sched.postprocess(plan, tokens, float(sched.step + 1))
    assert all(isinstance(t.ended, Finished) for t in turns.values())
    assert pool.num_free == BLOCKS and sched.swapped_blocks == 0
    reused = sum(e.cached_tokens for e in events if isinstance(e, Finished))
    return {name: t.output for name, t in turns.items()}, Counter([type(e) for e in events], kept=kept, copies=copies), reused


def check(engine: OpenCLEngine, policy: str) -> None:
    want, _, none = run(engine, policy, cache=False)
    got, events, reused = run(engine, policy, cache=True)
    assert none == 0
    assert got == want
    assert reused >= 69 + 80  # the repeat's 69 of 70 prompt tokens and the follow-up's 5 blocks at least
    assert events["copies"]  # the repeat's last block: its first rows copied, its last token computed
    assert events[Preempted]
    if policy == "swap":
        assert events[SwappedOut] and events[SwappedIn]
        assert events["kept"]  # the repeat was swapped out leaving the blocks it shares on the device
    if policy == "recompute":
        assert events[Recomputed]


@pytest.fixture(scope="module")
def tiny_engine(tiny_model: Model) -> OpenCLEngine:
    return OpenCLEngine(tiny_model, num_blocks=BLOCKS)


@pytest.mark.parametrize("policy", ["resident", "swap", "recompute"])
def test_cache_on_equals_cache_off_on_the_tiny_model(tiny_engine: OpenCLEngine, policy: str) -> None:
    check(tiny_engine, policy)


@pytest.mark.model
@pytest.mark.parametrize("policy", ["swap", "recompute"])
def test_cache_on_equals_cache_off_on_smollm2(smollm2_model: Model, policy: str) -> None:
    check(OpenCLEngine(smollm2_model, num_blocks=BLOCKS), policy)


class Chatty(Agent):
    """A multi-turn agent written the plain way: each turn resends the whole chat."""

    def __init__(self, name: str) -> None:
        super().__init__(name, BACKGROUND)
        self.replies: list[str] = []

    async def run(self) -> None:
        chat = [{"role": "system", "content": "You are a terse assistant who answers in one line. " * 3}]
        for question in ("What is a list?", "And a tuple?", "Which is faster?"):
            chat.append({"role": "user", "content": question})
            reply = await self.complete(chat, max_tokens=12)
            chat.append({"role": "assistant", "content": reply})
            self.replies.append(reply)


@pytest.mark.asyncio
async def test_a_multi_turn_agent_reuses_its_conversation_through_the_chat_template(tiny_gguf) -> None:
    """No API change: the chat template repeats the conversation, the chain hash finds it."""
    engine = OpenCLEngine(tiny_gguf, num_blocks=64)
    replies, admitted = {}, {}
    for cache in (True, False):
        async with Swarm(engine, slots=2, prefix_cache=cache) as swarm:
            log = swarm.bus.subscribe()
            agent = await swarm.spawn(Chatty("chatty"))
            await swarm.join(agent)
        replies[cache] = agent.replies
        admitted[cache] = [e async for e in log if isinstance(e, Admitted)]
    assert replies[True] == replies[False]
    assert [e.cached_tokens for e in admitted[False]] == [0, 0, 0]
    first, *later = [e.cached_tokens for e in admitted[True]]
    assert first == 0 and all(n >= 64 for n in later)  # at least the system prompt's blocks, every turn
    assert later[1] > later[0]  # and the conversation grows
