"""The scheduler's decisions, one scenario at a time, on a step-counted clock."""

from __future__ import annotations

import pytest

from runtime.errors import ConfigError
from runtime.events.kinds import Cancelled, Ended, Event, Failed, Finished, Preempted, Progress, Recomputed, Resumed, SwappedIn, SwappedOut
from runtime.scheduling.blocks import BlockPool
from runtime.scheduling.priority import BACKGROUND, FOREGROUND
from runtime.scheduling.scheduler import PROGRESS_S, Scheduler
from runtime.scheduling.timing import TimingEngine, TimingModel
from runtime.scheduling.turns import Policy, SchedulerConfig, Status, Turn

EOS = 2
STEP = 0.025


class Rig:
    """A scheduler plus a fake engine: every sampled token is 7 (never eos)."""

    def __init__(self, policy="resident", slots=2, blocks=64, block_size=4, **config):
        self.events: list[Event] = []
        self.sched = Scheduler(
            SchedulerConfig(slots=slots, policy=policy, **config),
            BlockPool(blocks, block_size),
            eos_token_ids=[EOS],
            emit=self.events.append,
        )
        self.now = 0.0
        self.swaps: list[tuple] = []

    def submit(self, agent, priority, prompt=3, max_tokens=10, **kw):
        return self.sched.submit(agent, priority, [5] * prompt, max_tokens, self.now, **kw)

    def step(self, token=7):
        plan = self.sched.schedule(self.now)
        self.swaps += [("out", *op) for op in plan.swap_out] + [("in", *op) for op in plan.swap_in]
        self.now += STEP
        self.sched.postprocess(plan, [token if w.sample else None for w in plan.works], self.now)
        return plan

    def named(self, kind):
        return [e for e in self.events if isinstance(e, kind)]


def test_fills_free_slots_in_priority_order():
    rig = Rig(policy="priority", slots=1)
    low = rig.submit("docs", BACKGROUND)
    high = rig.submit("pair", FOREGROUND)
    rig.step()
    assert high.slot == 0 and low.slot is None


def test_fcfs_ignores_priority():
    rig = Rig(policy="fcfs", slots=1)
    low = rig.submit("docs", BACKGROUND)
    rig.submit("pair", FOREGROUND)
    rig.step()
    assert low.slot == 0


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_non_preemptive_policies_let_the_foreground_wait(policy):
    rig = Rig(policy=policy, slots=1)
    low = rig.submit("docs", BACKGROUND, max_tokens=5)
    rig.step()
    high = rig.submit("pair", FOREGROUND)
    while not low.done:
        rig.step()
        assert high.slot is None or low.done
    rig.step()
    assert high.slot == 0 and not rig.named(Preempted)


def test_resident_preempts_at_the_next_boundary_and_keeps_kv():
    rig = Rig(slots=1)
    low = rig.submit("docs", BACKGROUND, max_tokens=20)
    for _ in range(4):
        rig.step()
    blocks, computed = list(low.blocks), low.computed
    high = rig.submit("pair", FOREGROUND, max_tokens=3)
    rig.step()
    assert high.slot == 0 and low.slot is None
    (pre,) = rig.named(Preempted)
    assert (pre.turn, pre.by_turn, pre.by_agent, pre.by_priority) == (low.id, high.id, "pair", FOREGROUND)
    assert low.blocks == blocks and low.computed == computed and low.status.resident
    while not high.done:
        rig.step()
    rig.step()
    (res,) = rig.named(Resumed)
    assert res.turn == low.id and res.paused_s > 0 and low.blocks[: len(blocks)] == blocks
    assert not rig.named(Recomputed) and not rig.swaps


def preempt_after_three_steps(rig: Rig) -> tuple[Turn, Turn, int, int]:
    """A background turn three steps in, preempted by a short foreground one:
    (low, high, low's computed and its length when preempted)."""
    low = rig.submit("docs", BACKGROUND, max_tokens=20)
    for _ in range(3):
        rig.step()
    computed, length = low.computed, low.length
    high = rig.submit("pair", FOREGROUND, max_tokens=2)
    rig.step()
    return low, high, computed, length


def test_swap_moves_the_victims_kv_out_and_back():
    rig = Rig(policy="swap", slots=1)
    low, high, computed, _ = preempt_after_three_steps(rig)
    assert low.blocks == [] and low.status is Status.SWAPPED
    while not high.done:
        rig.step()
    rig.step()
    kinds = [op[0] for op in rig.swaps]
    assert kinds == ["out", "in"]
    assert rig.swaps[0][1] == low.id and rig.swaps[0][3] == computed
    assert rig.named(SwappedOut) and rig.named(SwappedIn)


def test_recompute_drops_the_kv_and_reprefills_everything():
    rig = Rig(policy="recompute", slots=1, step_tokens=64, prefix_cache=False)
    low, high, _, length = preempt_after_three_steps(rig)
    assert low.blocks == [] and low.computed == 0
    while not high.done:
        rig.step()
    plan = rig.step()
    (work,) = plan.works
    assert work.turn == low.id and work.start == 0 and len(work.tokens) == length and work.sample
    assert rig.named(Recomputed)[0].tokens == length


def test_equal_priorities_never_preempt():
    rig = Rig(slots=1)
    first = rig.submit("a", BACKGROUND, max_tokens=30)
    rig.step()
    rig.submit("b", BACKGROUND)
    for _ in range(10):
        rig.step()
    assert first.slot == 0 and not rig.named(Preempted)


def test_victim_is_lowest_priority_then_latest_admitted():
    rig = Rig(slots=3)
    a = rig.submit("a", 1, max_tokens=50)
    rig.step()
    b = rig.submit("b", 1, max_tokens=50)
    rig.step()
    c = rig.submit("c", 2, max_tokens=50)
    rig.step()
    rig.submit("pair", FOREGROUND)
    rig.step()
    assert b.slot is None and a.slot is not None and c.slot is not None


def test_prefill_is_chunked_under_the_step_budget():
    rig = Rig(slots=2, step_tokens=8, blocks=64, shaping=False, prefix_cache=False)  # (both prompts are [5, 5, ...])
    bg = rig.submit("bg", BACKGROUND, max_tokens=100)
    rig.step()
    fg = rig.submit("fg", FOREGROUND, prompt=30)
    sizes = []
    while not fg.output:
        plan = rig.step()
        assert sum(len(w.tokens) for w in plan.works) <= 8
        sizes += [len(w.tokens) for w in plan.works if w.turn == fg.id]
        assert any(w.turn == bg.id for w in plan.works)  # the decode keeps going
    assert sum(sizes) == 30 and max(sizes) == 7


def test_eos_length_and_cancel_end_each_turn_once():
    rig = Rig(slots=3)
    a = rig.submit("a", 0, max_tokens=2)
    b = rig.submit("b", 0, max_tokens=50)
    c = rig.submit("c", 0, max_tokens=50)
    rig.step()
    rig.sched.cancel(c.id, rig.now)
    rig.sched.cancel(c.id, rig.now)
    rig.step()
    rig.step(token=EOS)
    ends = {e.turn: (type(e), e.reason) for e in rig.events if isinstance(e, Ended)}
    assert ends == {a.id: (Finished, "length"), b.id: (Finished, "eos"), c.id: (Cancelled, "cancelled")}
    assert len([e for e in rig.events if isinstance(e, Ended)]) == 3
    assert rig.sched.pool.num_free == rig.sched.pool.num_blocks


def test_unrunnable_turns_fail_at_once_with_a_reason():
    rig = Rig(blocks=4, block_size=4)
    empty = rig.submit("a", 0, prompt=0)
    huge = rig.submit("a", 0, prompt=10, max_tokens=100)
    assert isinstance(empty.ended, Failed) and empty.ended.reason == "empty prompt"
    assert isinstance(huge.ended, Failed) and "KV blocks" in huge.ended.reason


def test_inherited_priority_preempts_and_is_restored():
    rig = Rig(slots=1)
    busy = rig.submit("tests", 5, max_tokens=50)
    rig.step()
    helper = rig.submit("reviewer", BACKGROUND, max_tokens=50)
    rig.step()
    assert helper.slot is None
    rig.sched.set_inherited("reviewer", FOREGROUND, rig.now)
    rig.step()
    assert helper.slot == 0 and rig.sched.effective(helper, rig.now) == FOREGROUND
    rig.sched.set_inherited("reviewer", None, rig.now)
    assert rig.sched.effective(helper, rig.now) == BACKGROUND
    assert rig.sched.effective(busy, rig.now) >= 5


def test_aging_bounds_a_starved_turns_wait():
    """A priority-0 turn behind an endless stream of priority-5 turns waits at most
    (5 - 0 + 1) aging periods plus one step, then preempts (cap stays below FOREGROUND)."""
    rig = Rig(slots=1, aging_s=1.0)
    starved = rig.submit("docs", 0, max_tokens=5)
    while not starved.done and rig.now < 60:
        if not any(t.priority == 5 and not t.done for t in rig.sched.turns.values()):
            rig.submit("tests", 5, max_tokens=40)
        rig.step()
    assert starved.admitted_at is not None
    assert starved.admitted_at - starved.arrived <= 6 * 1.0 + STEP
    assert rig.sched.effective(starved, 1000.0) <= FOREGROUND - 1


def test_a_waiting_turn_ages_past_the_running_one_with_nothing_else_changing():
    """With every slot busy the queue is only looked at again when something
    changes (Scheduler._queue_stuck); a waiting turn gaining an aging level is
    such a change, though no turn arrives, ends or is lent anything."""
    rig = Rig(slots=1, aging_s=1.0, blocks=256)
    running = rig.submit("tests", 1, max_tokens=400)
    rig.step()
    waiting = rig.submit("docs", 0, max_tokens=5)
    while waiting.slot is None and rig.now < 10:
        rig.step()
    # Two levels (at 2 s) put it above the running turn's 1: it takes the slot at
    # the first boundary after, and not before.
    assert waiting.slot == 0 and running.slot is None
    assert 2.0 <= waiting.admitted_at - waiting.arrived <= 2.0 + 2 * STEP


def test_aging_never_preempts_the_foreground():
    rig = Rig(slots=1, aging_s=0.1, blocks=256)
    fg = rig.submit("pair", FOREGROUND, max_tokens=400)
    bg = rig.submit("docs", BACKGROUND)
    for _ in range(200):
        rig.step()
    assert fg.slot == 0 and bg.slot is None and not rig.named(Preempted)


def test_memory_pressure_swaps_then_drops_paused_turns_never_errors():
    # 6 blocks of 4 positions: two turns fill the pool, so the foreground's KV must
    # come from paused turns: swapped out while host room (2 blocks) lasts, then dropped.
    rig = Rig(slots=2, blocks=6, block_size=4, swap_blocks=2)
    turns = [rig.submit(f"bg{i}", 0, prompt=4, max_tokens=8) for i in range(2)]
    for _ in range(5):
        rig.step()
    turns += [rig.submit(f"fg{i}", FOREGROUND, prompt=4, max_tokens=8) for i in range(2)]
    for _ in range(100):
        rig.step()
        used = len({b for t in rig.sched.turns.values() for b in t.blocks})  # (a shared block counts once)
        assert used + rig.sched.pool.num_free == 6
    assert all(isinstance(t.ended, Finished) for t in turns)
    assert rig.named(SwappedOut) and rig.named(SwappedIn) and rig.named(Recomputed)
    assert rig.sched.pool.num_free == 6 and rig.sched.swapped_blocks == 0


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="policy"):
        SchedulerConfig(policy="lottery")
    with pytest.raises(ConfigError, match="step_tokens"):
        SchedulerConfig(slots=8, step_tokens=4)


def test_fast_forward_equals_single_steps():
    """A plan standing for k steps must leave the scheduler exactly where k single
    steps would: same events at the same step numbers, same outputs."""

    def run(k):
        events: list[Event] = []
        sched = Scheduler(SchedulerConfig(slots=3, policy=Policy.RESIDENT), BlockPool(400, 4), emit=events.append)
        engine = TimingEngine(TimingModel())
        turns = [sched.submit(f"bg{i}", 0, [1] * 5, 17 + 13 * i, 0.0, ignore_eos=True) for i in range(4)]
        while any(not t.done for t in turns):
            now = sched.step * STEP
            if sched.step == 20:
                turns.append(sched.submit("fg", FOREGROUND, [1] * 3, 9, now, ignore_eos=True))
            plan = sched.schedule(now)
            steps = sched.repeatable(plan, k if sched.step >= 20 or sched.step + k <= 20 else 20 - sched.step)
            sched.postprocess(plan, engine.step(plan.works), (sched.step + steps) * STEP, repeats=steps)
        return [(type(e), e.turn, e.step, e.slot) for e in events], [len(t.output) for t in turns]

    assert run(1) == run(1000)


def test_a_foreground_end_event_carries_every_token_time():
    rig = Rig(slots=1)
    low = rig.submit("docs", BACKGROUND, max_tokens=5)
    rig.step()
    rig.step()  # docs' first two tokens, at steps 1 and 2
    high = rig.submit("pair", FOREGROUND, max_tokens=3)
    while not high.done:
        rig.step()
    while not low.done:
        rig.step()
    ends = {e.turn: e for e in rig.named(Ended)}
    # It preempted docs at once; its prompt took one step, then a token a step.
    assert ends[high.id].token_s == pytest.approx([STEP, 2 * STEP, 3 * STEP])
    assert ends[high.id].ttft_s == pytest.approx(ends[high.id].token_s[0])
    assert ends[low.id].token_s is None  # background turns keep their end events small


def test_a_turn_lent_foreground_priority_carries_every_token_time_too():
    rig = Rig(slots=1)
    helper = rig.submit("reviewer", BACKGROUND, max_tokens=3)  # serving a foreground agent that waits on it
    rig.sched.set_inherited("reviewer", FOREGROUND, rig.now)
    while not helper.done:
        rig.step()
    (end,) = rig.named(Ended)
    assert end.priority == FOREGROUND and end.token_s == pytest.approx([STEP, 2 * STEP, 3 * STEP])


def test_a_running_turns_progress_is_told_once_a_second_of_swarm_clock():
    rig = Rig(slots=2)
    long = rig.submit("docs", BACKGROUND, max_tokens=100)
    short = rig.submit("tests", BACKGROUND, max_tokens=30)
    while not long.done:
        plan = rig.sched.schedule(rig.now)
        rig.now = (rig.sched.step + 1) / 32  # 32 steps a second, exactly
        rig.sched.postprocess(plan, [7] * len(plan.works), rig.now)
        rig.sched.tell_progress(rig.now)
    told = rig.named(Progress)
    mine = [e for e in told if e.turn == long.id]
    # Told at its first token, then every 32 steps; its end tells the rest.
    assert [e.tokens for e in mine] == [1, 33, 65, 97] and [e.step for e in mine] == [1, 33, 65, 97]
    assert [b.t - a.t for a, b in zip(mine, mine[1:], strict=False)] == [PROGRESS_S] * 3
    # The short turn ended at token 30: told once, its end counts the rest.
    assert [e.tokens for e in told if e.turn == short.id] == [1]
    assert {e.turn: e.tokens for e in rig.named(Ended)} == {long.id: 100, short.id: 30}


def test_progress_is_told_only_for_new_tokens():
    rig = Rig(slots=1)
    low = rig.submit("docs", BACKGROUND, max_tokens=100)
    rig.step()
    rig.sched.tell_progress(rig.now)
    high = rig.submit("pair", FOREGROUND, max_tokens=100)
    rig.step()  # pair takes docs' slot: docs stands still while paused
    for _ in range(2):
        rig.now += PROGRESS_S
        rig.sched.tell_progress(rig.now)
    told = [(e.agent, e.tokens) for e in rig.named(Progress)]
    assert told == [("docs", 1), ("pair", 1)] and low.status is Status.PAUSED and high.slot == 0


def test_a_kv_move_is_told_once_made_and_a_failed_one_never():
    rig = Rig(policy="swap", slots=1)
    low = rig.submit("docs", BACKGROUND, max_tokens=20)
    for _ in range(3):
        rig.step()
    rig.submit("pair", FOREGROUND, max_tokens=2)
    plan = rig.sched.schedule(rig.now)
    assert plan.swap_out and not rig.named(SwappedOut)  # decided, not made yet
    rig.sched.settle_moves(plan, {}, rig.now)
    (told,) = rig.named(SwappedOut)
    assert told.turn == low.id and not plan.moved
    rig.sched.postprocess(plan, [7] * len(plan.works), rig.now)
    assert len(rig.named(SwappedOut)) == 1  # told once

    rig = Rig(policy="swap", slots=1)
    low = rig.submit("docs", BACKGROUND, max_tokens=20)
    for _ in range(3):
        rig.step()
    rig.submit("pair", FOREGROUND, max_tokens=2)
    plan = rig.sched.schedule(rig.now)
    rig.sched.settle_moves(plan, {low.id: "SwapOut failed: injected"}, rig.now)
    assert not rig.named(SwappedOut) and low.status is Status.DROPPED and low.computed == 0
