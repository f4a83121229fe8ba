"""The GPU owner plans step N+1 while step N runs (Scheduler.advance, the
scheduler's steps in flight in runtime.scheduling.inflight): the step
thread puts step N's tokens into N+1's decodes and starts it as soon as N ends.

Proved with explicit synchronisation (a step held on the device while the test
watches what has been planned), and for correctness against turns run alone,
in order: greedy outputs, turns that end on end-of-sequence mid-batch (their
work in the step after is thrown away, their blocks reused), cancels and
preemptions landing while a step is in flight, one terminal event each, no
block leaked. The scheduler is also driven directly, one step ahead as the
owner drives it, against the same scheduler driven in order."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Collection

import anyio
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kv_engine import EOS, KVEngine, reference_output

from runtime.events.kinds import Ended, Event, Finished, Queued
from runtime.scheduling.blocks import BlockPool
from runtime.scheduling.priority import BACKGROUND, FOREGROUND
from runtime.scheduling.scheduler import Scheduler
from runtime.scheduling.turns import Policy, SchedulerConfig
from runtime.scheduling.work import NOT_SAMPLED, Work
from swarm import Agent, Swarm


class HeldKVEngine(KVEngine):
    """Each step waits on the device until the test lets it go; the tokens each
    step was given are kept."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.gate = threading.Semaphore(0)
        self.inputs: list[list[list[int]]] = []

    def step(self, batch, abandon=None):
        self.inputs.append([list(w.tokens) for w in batch])
        if not self.gate.acquire(timeout=10):
            raise AssertionError("a step waited 10 s to be let go: the test expected another")
        return super().step(batch)


async def until(condition, what: str) -> None:
    with anyio.fail_after(10):
        while not condition():
            await anyio.sleep(0.001)


@pytest.mark.anyio
async def test_the_next_step_is_planned_and_launched_while_the_one_before_is_on_the_device():
    engine = HeldKVEngine(num_blocks=16, block_size=4)
    prompt, n = [5, 6, 7], 5
    got: list[int] = []
    async with Swarm(engine, slots=1) as s:
        agent = await s.spawn(Agent("a"))
        sched = s.owner.scheduler

        async def read() -> None:
            async with agent.generate(prompt, max_tokens=n, ignore_eos=True) as turn:
                async for _ in turn:
                    got.append(turn.tokens[-1])

        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            for k in range(1, n):
                # Step k is held on the device; step k+1 is planned, on a token
                # nobody knows yet, and handed to the step thread behind it.
                await until(lambda k=k: sched.step == k + 1 and len(engine.inputs) == k, f"step {k + 1} planned")
                assert engine.steps == k - 1  # step k has not ended
                assert len(got) <= k - 1  # so its token cannot have been delivered
                engine.gate.release()
                # Step k+1 reaches the device with step k's token put in.
                await until(lambda k=k: len(engine.inputs) == k + 1, f"step {k + 1} started")
                assert engine.inputs[k] == [[reference_output(prompt, n)[k - 1]]]
            engine.gate.release()  # the last step: its token is the turn's last, so nothing follows it
    assert got == reference_output(prompt, n)
    assert len(engine.inputs) == n  # no step was run for nothing


class Reader(Agent):
    def __init__(
        self, name: str, priority: int, prompt: list[int], max_tokens: int, ignore_eos: bool, leave_after: int | None = None
    ) -> None:
        super().__init__(name, priority)
        self.prompt, self.max_tokens, self.ignore_eos, self.leave_after = prompt, max_tokens, ignore_eos, leave_after
        self.tokens: list[int] | None = None

    async def run(self) -> None:
        async with self.generate(self.prompt, max_tokens=self.max_tokens, ignore_eos=self.ignore_eos) as turn:
            async for _ in turn:
                if self.leave_after is not None and len(turn.tokens) >= self.leave_after:
                    return  # leaves mid-turn: cancelled while its next step is in flight
        self.tokens = turn.tokens


@pytest.mark.anyio
@pytest.mark.parametrize("policy", [Policy.RESIDENT, Policy.SWAP, Policy.RECOMPUTE])
async def test_turns_that_end_mid_batch_cancel_or_are_preempted_while_a_step_is_in_flight_say_what_they_say_alone(policy):
    every = 9
    engine = KVEngine(num_blocks=14, block_size=4, eos_every=every)
    ends: Counter[int] = Counter()
    reasons: Counter[str] = Counter()
    readers = []
    with anyio.fail_after(60):
        async with Swarm(engine, slots=3, policy=policy, step_tokens=8) as s:
            sub = s.bus.subscribe(max_buffer=10**9)
            for i in range(12):
                prompt = [3 + (i * 7 + j) % 60 for j in range(2 + i % 5)]
                readers.append(
                    Reader(f"bg{i}", BACKGROUND, prompt, 6 + i % 9, ignore_eos=i % 3 == 0, leave_after=2 if i % 4 == 1 else None)
                )
            for i in range(3):  # the foreground arriving later takes slots (preempting) at a boundary
                readers.append(Reader(f"fg{i}", FOREGROUND, [40 + i, 41, 42], 7, ignore_eos=False))
            for r in readers[:12]:
                await s.spawn(r)
            await until(lambda: s.owner.steps_run >= 6, "background running")
            for r in readers[12:]:
                await s.spawn(r)
            for r in readers:
                await s.join(r.name)
            await until(lambda: not s.owner.scheduler.turns, "every turn over")
            sched = s.owner.scheduler
            assert sched.pool.num_free == sched.pool.num_blocks, "a KV block leaked"
            assert sched.swapped_blocks == 0 and not engine.host
            sub.close()
            queued = set()
            async for e in sub:
                if isinstance(e, Queued):
                    queued.add(e.turn)
                if isinstance(e, Ended):
                    ends[e.turn] += 1
                    reasons[e.reason] += 1
    assert set(ends) == queued and set(ends.values()) == {1}
    assert reasons["eos"] >= 3 and reasons["length"] >= 1 and sum(reasons.values()) - reasons["eos"] - reasons["length"] >= 1, reasons
    for r in readers:
        if r.leave_after is None:
            assert r.tokens == reference_output(r.prompt, r.max_tokens, eos_every=every, ignore_eos=r.ignore_eos), r.name


# ------------------------------------------------------- the scheduler alone


def with_token(work: Work, token: int) -> Work:
    """A decode planned on a token not sampled yet, given it (in a copy)."""
    return msgspec.structs.replace(work, tokens=[*work.tokens[:-1], token], follows=False)


def drive(
    sched: Scheduler,
    engine: KVEngine,
    *,
    ahead: bool,
    cancel_at: dict[int, int],
    arrive_at: dict[int, list],
    abandon_at: Collection[int] = (),
) -> None:
    """Run every turn to its end, the way the owner does (`ahead`: plan a step
    before the one before is accounted) or in order. `cancel_at` cancels a turn
    at a boundary, `arrive_at` submits turns there; `abandon_at` abandons the
    step in flight there (runtime.owner.abandon: it counts for nothing)."""
    now, boundary, flight = 0.0, 0, None
    sampled: dict[int, int | None] = {}

    def land() -> None:
        nonlocal flight
        if flight is not None:
            sched.postprocess(flight[0], flight[1], now)
            flight = None

    while sched.turns or flight or any(b >= boundary for b in arrive_at):
        boundary += 1
        assert boundary < 10_000, "the turns never end"
        now += 0.01
        if flight is not None and boundary in abandon_at:
            sched.discard(flight[0])
            flight = None
        for args in arrive_at.get(boundary, []):
            sched.submit(*args[:4], now, ignore_eos=args[4])
        for turn_id, at in cancel_at.items():
            if at == boundary:
                sched.cancel(turn_id, now)
        plan = sched.schedule(now)
        if plan.moves:
            land()
            for move in plan.moves:
                move.apply(engine)
            sched.settle_moves(plan, {}, now)
        if not plan.works:
            land()
            continue
        if not ahead:
            sched.postprocess(plan, engine.step(plan.works), now)
            continue
        sched.advance(plan)
        # The device runs steps in order: the step before has ended when this one
        # starts (accounted or not: moves take it in first), and its tokens go
        # into this one's decodes, in copies (as StepInFlight.hand_over does).
        works = [with_token(w, sampled[w.turn]) if w.follows else w for w in plan.works]
        tokens = engine.step(works)
        sampled = {w.turn: t for w, t in zip(works, tokens, strict=False) if w.sample}
        land()
        flight = (plan, tokens)


@pytest.mark.parametrize("policy", list(Policy), ids=[p.value for p in Policy])
def test_a_scheduler_planning_one_step_ahead_gives_every_turn_what_it_gives_in_order(policy):
    outcomes = []
    for ahead in (False, True):
        engine = KVEngine(num_blocks=16, block_size=4, eos_every=7)
        events: list[Event] = []
        sched = Scheduler(SchedulerConfig(slots=3, policy=policy, step_tokens=8), BlockPool(16, 4), eos_token_ids={EOS}, emit=events.append)
        turns = [
            sched.submit(f"bg{i}", BACKGROUND, [3 + (5 * i + j) % 60 for j in range(1 + i % 6)], 5 + i % 8, 0.0, ignore_eos=i % 4 == 0)
            for i in range(9)
        ]
        late = {6: [("fg", FOREGROUND, [50, 51], 6, False)], 9: [("fg2", FOREGROUND, [52], 4, False)]}
        drive(sched, engine, ahead=ahead, cancel_at={turns[2].id: 4, turns[7].id: 12}, arrive_at=late)
        assert sched.pool.num_free == sched.pool.num_blocks and sched.swapped_blocks == 0
        ended = {e.turn: e for e in events if isinstance(e, Ended)}
        assert Counter(e.turn for e in events if isinstance(e, Ended)) == Counter(set(ended))  # one each
        outputs = {t.id: (t.output, ended[t.id].reason) for t in turns}
        for t in turns:
            if ended[t.id].reason != "cancelled":
                assert t.output == reference_output(t.prompt, t.max_tokens, eos_every=7, ignore_eos=t.ignore_eos)
                assert isinstance(ended[t.id], Finished) and ended[t.id].tokens == len(t.output)
        assert not sched.in_flight.plans and not sched.in_flight.sampling(turns[0]) and sched.step == engine.steps
        outcomes.append({k: v for k, v in outputs.items() if v[1] != "cancelled"})
    both = outcomes[0].keys() & outcomes[1].keys()  # (a cancel may find a turn ended already in one run)
    assert len(both) >= 7 and {k: outcomes[0][k] for k in both} == {k: outcomes[1][k] for k in both}


@settings(max_examples=40, deadline=None)
@given(
    policy=st.sampled_from(list(Policy)),
    num_blocks=st.sampled_from([12, 16, 40]),
    prompts=st.lists(st.lists(st.integers(3, 60), min_size=1, max_size=9), min_size=2, max_size=8),
    abandon_at=st.sets(st.integers(1, 80), max_size=25),
)
def test_steps_abandoned_while_the_next_is_planned_change_no_turn(policy, num_blocks, prompts, abandon_at):
    engine = KVEngine(num_blocks=num_blocks, block_size=4, eos_every=7)
    events: list[Event] = []
    config = SchedulerConfig(slots=3, policy=policy, step_tokens=8)
    sched = Scheduler(config, BlockPool(num_blocks, 4), eos_token_ids={EOS}, emit=events.append)
    turns = [sched.submit(f"bg{i}", BACKGROUND, p, 3 + i % 5, 0.0, ignore_eos=i % 3 == 0) for i, p in enumerate(prompts)]
    late = {3: [("fg", FOREGROUND, [50, 51], 4, False)]}
    drive(sched, engine, ahead=True, cancel_at={}, arrive_at=late, abandon_at=abandon_at)
    for t in turns:
        assert t.output == reference_output(t.prompt, t.max_tokens, eos_every=7, ignore_eos=t.ignore_eos)
    assert Counter(e.turn for e in events if isinstance(e, Ended)) == Counter({e.turn: 1 for e in events if isinstance(e, Queued)})
    assert sched.pool.num_free == sched.pool.num_blocks and sched.swapped_blocks == 0 and not sched.in_flight.plans


@pytest.mark.parametrize("ahead", [False, True])
def test_turns_with_one_prompt_compute_it_once_when_planned_ahead(ahead):
    # The second turn arrives while the first one's prompt is in flight: it waits
    # for the blocks in flight (they are only shared once accounted) rather than
    # compute them again, and takes them by reference.
    engine = KVEngine(num_blocks=64, block_size=4)
    events: list[Event] = []
    sched = Scheduler(SchedulerConfig(slots=4, step_tokens=16), BlockPool(64, 4), emit=events.append)
    prompt = [3 + j % 50 for j in range(60)]
    first = sched.submit("a", BACKGROUND, prompt + [7], 3, 0.0, ignore_eos=True)
    drive(sched, engine, ahead=ahead, cancel_at={}, arrive_at={2: [("b", BACKGROUND, prompt + [8, 9], 3, True)]})
    computed = {e.agent: e.computed_tokens for e in events if isinstance(e, Finished)}
    assert computed["a"] == len(first.prompt)
    assert computed["b"] <= 2 * 4  # its own tail: the shared prompt came by reference


def test_the_hand_over_gives_the_step_resolved_copies_and_leaves_its_plan_as_planned():
    """StepInFlight.hand_over: a decode planned on a token not sampled yet runs
    with that token, in a copy; a decode whose token never came is left out;
    the plan the scheduler accounts keeps what it planned."""
    from runtime.owner.flight import StepInFlight
    from runtime.scheduling.turns import Plan

    def step_of(works: list[Work], ahead: StepInFlight | None) -> StepInFlight:
        return StepInFlight(Plan(works=works), ahead, None, chained=ahead is not None)

    before = step_of([], None)
    before.sampled = {1: 42, 2: 43}

    def follower(turn: int, start: int, table: list[int]) -> Work:
        return Work(turn, [NOT_SAMPLED], start, table, True, follows=True)

    planned = [follower(1, 9, [0]), follower(2, 5, [1]), Work(3, [7, 8], 0, [2], True)]
    after = step_of(planned, before)
    runs = after.hand_over()
    assert [(w.turn, w.tokens, w.follows) for w in runs] == [(1, [42], False), (2, [43], False), (3, [7, 8], False)]
    assert [(w.tokens, w.follows) for w in after.plan.works] == [([NOT_SAMPLED], True), ([NOT_SAMPLED], True), ([7, 8], False)]
    before.sampled = {1: 42}  # turn 2's step faulted: no token for it
    faulted = step_of([follower(1, 9, [0]), follower(2, 5, [1])], before)
    assert [(w.turn, w.tokens) for w in faulted.hand_over()] == [(1, [42])]
    assert [w.tokens for w in faulted.plan.works] == [[NOT_SAMPLED], [NOT_SAMPLED]]


def test_a_step_in_flight_changes_no_turn_until_it_lands_and_an_abandoned_one_none_at_all():
    """Turns hold only settled facts: what a step launched will add is in the
    scheduler's steps in flight (runtime.scheduling.inflight) until it lands, and
    a step abandoned is forgotten with nothing to undo."""
    engine = KVEngine(num_blocks=16, block_size=4)
    sched = Scheduler(SchedulerConfig(slots=2, step_tokens=8), BlockPool(16, 4))
    turn = sched.submit("a", BACKGROUND, [5, 6, 7], 4, 0.0, ignore_eos=True)
    first = sched.schedule(0.0)
    sched.advance(first)
    ahead = sched.in_flight
    assert (turn.output, turn.computed) == ([], 0) and sched.step == 1
    assert (ahead.computed(turn), ahead.length(turn), ahead.sampling(turn), ahead.pending(turn)) == (3, 4, 1, 1)
    second = sched.schedule(0.1)  # planned on the token the first samples
    [work] = second.works
    assert work.follows and work.start == 3 and work.sample and work.tokens == [NOT_SAMPLED]
    sched.advance(second)
    assert sched.step == 2 and ahead.computed(turn) == 4 and ahead.sampling(turn) == 2
    sched.discard(second)  # abandoned
    assert sched.step == 1 and [p is first for p in ahead.plans] == [True] and ahead.computed(turn) == 3
    assert (turn.output, turn.computed) == ([], 0)
    tokens = engine.step(first.works)
    sched.postprocess(first, tokens, 0.2)
    assert (turn.output, turn.computed, sched.step) == ([tokens[0]], 3, 1) and not ahead.plans
    assert (ahead.computed(turn), ahead.sampling(turn)) == (3, 0)
    again = sched.schedule(0.3)  # the abandoned step's work, planned again on settled facts
    assert [(w.tokens, w.start, w.follows) for w in again.works] == [([tokens[0]], 3, False)]


def test_a_turn_whose_kv_is_dropped_while_its_step_flies_keeps_its_token_and_none_of_the_kv():
    engine = KVEngine(num_blocks=16, block_size=4)
    sched = Scheduler(SchedulerConfig(slots=1, policy=Policy.RECOMPUTE, step_tokens=8), BlockPool(16, 4))
    bg = sched.submit("bg", BACKGROUND, [5, 6, 7], 4, 0.0, ignore_eos=True)
    prefill = sched.schedule(0.0)
    sched.postprocess(prefill, engine.step(prefill.works), 0.0)
    decode = sched.schedule(0.1)
    sched.advance(decode)
    assert (bg.computed, sched.in_flight.computed(bg)) == (3, 4)
    sched.submit("fg", FOREGROUND, [9], 2, 0.2)
    takeover = sched.schedule(0.2)  # bg is paused for it, its K/V dropped, while its decode flies
    assert bg.status.name == "DROPPED" and (bg.computed, sched.in_flight.computed(bg)) == (0, 0)
    sched.advance(takeover)
    sched.postprocess(decode, engine.step(decode.works), 0.3)
    assert bg.computed == 0 and len(bg.output) == 2  # the token sampled before the pause, none of its K/V
