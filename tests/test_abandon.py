"""Abandoning the step in flight for a turn that outranks all of it (runtime.owner.abandon).

On the OpenCL engine (both kernel families): a step stopped part-way returns
None, and running the batch again gives exactly the tokens an unbroken step
gives, although the stopped one wrote part of its K/V. On the owner: a
foreground request that arrives while a background step is held on the device
abandons it and takes a slot at the next boundary, nobody's output changes, and
arrivals that do not outrank the step, or policies that do not preempt, leave it
alone. Steps are held and released by the test: nothing depends on speed.
"""

from __future__ import annotations

import threading

import anyio
import numpy as np
import pytest
from kv_engine import KVEngine, next_token

from gpu.engine import OpenCLEngine
from runtime.events.kinds import Admitted, Ended, Event, Preempted, StepAbandoned
from runtime.scheduling.work import Work
from swarm import BACKGROUND, FOREGROUND, Agent, Swarm

# ------------------------------------------------------------------ the engine


class SetAt(threading.Event):
    """A flag that reads as set from its `n`-th look on: a step stopped at a
    chosen check point, whatever the speed of the machine."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n, self.looks = n, 0

    def is_set(self) -> bool:
        self.looks += 1
        return self.looks >= self.n


def turn_blocks(turn: int) -> list[int]:
    return [turn * 8 + j for j in range(8)]


def run_turns(engine: OpenCLEngine, first: int, stop_at: int | None) -> list[list[int]]:
    """Three turns (at `first`, `first`+1, ...) prefilled together, then decoded
    together for four steps; with `stop_at`, every step is first run once and
    stopped at that check point. Their tokens."""
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, engine.config.vocab_size, n).tolist() for n in (5, 17, 30)]
    outputs: list[list[int]] = [[] for _ in prompts]
    for _ in range(5):
        batch = []
        for i, prompt in enumerate(prompts):
            out = outputs[i]
            tokens, start = (prompt, 0) if not out else ([out[-1]], len(prompt) + len(out) - 1)
            batch.append(Work(turn=first + i, tokens=tokens, start=start, block_table=turn_blocks(first + i), sample=True))
        if stop_at is not None:
            flag = SetAt(stop_at)
            assert engine.step(batch, flag) is None
            assert flag.looks == stop_at  # it stopped at that check, not later
        for out, token in zip(outputs, engine.step(batch), strict=False):
            out.append(token)
    return outputs


@pytest.mark.parametrize("stop_at", [1, 2, 4])
def test_a_step_stopped_part_way_changes_no_token(engine: OpenCLEngine, stop_at: int) -> None:
    unbroken = run_turns(engine, 0, None)
    assert run_turns(engine, 3, stop_at) == unbroken


def test_an_unset_flag_changes_nothing(engine: OpenCLEngine) -> None:
    batch = [Work(turn=0, tokens=[1, 2, 3], start=0, block_table=turn_blocks(0), sample=True)]
    flag = threading.Event()
    assert engine.step(batch, flag) == engine.step(batch)
    assert not flag.is_set()


# ------------------------------------------------------------------- the owner


class HeldEngine(KVEngine):
    """Each step waits until the test releases it (`free`), or until the owner
    abandons it; an abandoned step first scribbles over the K/V at its batch's
    positions, as a device stopped part-way leaves them. The KV engine's tokens
    hash the whole sequence as read from the cache, so a step counted although
    abandoned, or garbage read back, changes every later token."""

    def __init__(self) -> None:
        super().__init__(num_blocks=64)
        self.free = threading.Event()
        self.in_flight = threading.Event()
        self.abandoned = 0

    def step(self, batch, abandon=None):
        self.in_flight.set()
        try:
            while not self.free.wait(0.005):
                if abandon is not None and abandon.is_set():
                    bs = self.block_size
                    for w in batch:
                        for p in range(w.start, w.start + len(w.tokens)):
                            self.cache[w.block_table[p // bs], p % bs] = 1  # (a token no turn holds)
                    self.abandoned += 1
                    return None
            return super().step(batch)
        finally:
            self.in_flight.clear()


PROMPTS = {"bg": [10, 11, 12, 13, 14], "fg": [20, 21, 22]}


def expected(prompt: list[int], n: int) -> list[int]:
    seq, out = list(prompt), []
    for _ in range(n):
        out.append(next_token(seq))
        seq.append(out[-1])
    return out


class Asker(Agent):
    def __init__(self, name: str, priority: int, tokens: int) -> None:
        super().__init__(name, priority)
        self.tokens, self.got = tokens, []

    async def run(self) -> None:
        async with self.generate(PROMPTS[self.name[:2]], max_tokens=self.tokens, ignore_eos=True) as turn:
            async for _ in turn:
                pass
            self.got = list(turn.tokens)


async def held_step(s: Swarm, engine: HeldEngine) -> None:
    """Until a step is held on the device."""
    while not engine.in_flight.is_set():
        await anyio.sleep(0.005)


@pytest.mark.anyio
async def test_a_foreground_arrival_abandons_a_background_step_and_takes_the_slot():
    engine = HeldEngine()
    events: list[Event] = []
    with anyio.fail_after(60):
        async with Swarm(engine, slots=1) as s:
            sub = s.bus.subscribe(max_buffer=10**6)
            bg = await s.spawn(Asker("bg", BACKGROUND, 6))
            await held_step(s, engine)  # the background prompt's step, held
            fg = await s.spawn(Asker("fg", FOREGROUND, 4))
            async for event in sub:  # (the flag is set when the owner hears the request)
                events.append(event)
                if isinstance(event, StepAbandoned):
                    break
            engine.free.set()  # from here on every step runs at once
            await s.join(fg)
            await s.join(bg)
            async for event in sub:
                events.append(event)
                if isinstance(event, Ended) and event.agent == "bg":
                    break
    abandoned = [e for e in events if isinstance(e, StepAbandoned)]
    assert engine.abandoned == 1 and len(abandoned) == 1
    (a,) = abandoned
    assert (a.turns, a.tokens, a.by_agent, a.by_priority) == (1, len(PROMPTS["bg"]), "fg", FOREGROUND)
    # At the very next boundary (no step was counted in between): the foreground
    # is admitted in the background turn's slot, and the background turn is told.
    admitted = next(e for e in events if isinstance(e, Admitted) and e.agent == "fg")
    preempted = next(e for e in events if isinstance(e, Preempted))
    assert admitted.step == preempted.step == a.step == 0
    assert (preempted.agent, preempted.by_agent) == ("bg", "fg")
    # Nothing the stopped step wrote survived into anyone's tokens.
    assert fg.got == expected(PROMPTS["fg"], 4)
    assert bg.got == expected(PROMPTS["bg"], 6)
    assert sum(isinstance(e, Ended) for e in events) == 2


@pytest.mark.anyio
@pytest.mark.parametrize(
    "case, options, arriving",
    [
        ("a background arrival", {}, BACKGROUND),
        ("a non-preempting policy", {"policy": "priority"}, FOREGROUND),
        ("abandon_steps off", {"abandon_steps": False}, FOREGROUND),
    ],
)
async def test_what_does_not_abandon_a_step(case, options, arriving):
    engine = HeldEngine()
    with anyio.fail_after(60):
        async with Swarm(engine, **{"slots": 2, **options}) as s:
            bg = await s.spawn(Asker("bg", BACKGROUND, 3))
            await held_step(s, engine)
            other = await s.spawn(Asker("fg" if arriving == FOREGROUND else "bg2", arriving, 2))
            while not s.owner.intake.waiting:  # the owner has heard the request
                await anyio.sleep(0.005)
            assert not s.owner.abandon.raised, case
            engine.free.set()
            await s.join(bg)
            await s.join(other)
    assert engine.abandoned == 0, case
    assert bg.got == expected(PROMPTS["bg"], 3)


@pytest.mark.anyio
async def test_an_arrival_at_the_steps_own_priority_does_not_abandon_it():
    engine = HeldEngine()
    with anyio.fail_after(60):
        async with Swarm(engine, slots=2) as s:
            first = await s.spawn(Asker("fg1", FOREGROUND, 3))
            await held_step(s, engine)
            second = await s.spawn(Asker("fg2", FOREGROUND, 2))
            while not s.owner.intake.waiting:
                await anyio.sleep(0.005)
            assert not s.owner.abandon.raised
            engine.free.set()
            await s.join(first)
            await s.join(second)
    assert engine.abandoned == 0
