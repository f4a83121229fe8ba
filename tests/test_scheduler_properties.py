"""Hypothesis drives the scheduler through random submits, steps, cancels, priority
loans and clock jumps, checking its invariants after every move.

A shadow KV cache stands in for the engine: it records which token each block
holds at each offset, moves blocks on swap-out and swap-in, and checks that every
step reads exactly the turn's own tokens at every position before it (so a block
shared through the prefix cache always holds what the sharer would have
computed) and never writes a block another turn holds. The "model" is greedy: its
next token is a function of the sequence so far, so equal prompts share outputs.
"""

from __future__ import annotations

import zlib
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from runtime.events.kinds import Ended, Event, Preempted
from runtime.scheduling.blocks import BlockPool
from runtime.scheduling.cost import StepCost, step_features
from runtime.scheduling.priority import FOREGROUND
from runtime.scheduling.scheduler import Scheduler
from runtime.scheduling.turns import Copy, Policy, SchedulerConfig, Status, SwapIn, SwapOut

EOS = 2
AGENTS = {"pair": FOREGROUND, "tests": 3, "docs": 0, "review": 0}
# Prompts that share prefixes of different lengths (cut to 1-9 tokens at submit).
PROMPTS = ([5] * 9, [5, 5, 5, 5, 6, 6, 6, 6, 6], [5, 5, 3, 3, 3, 3, 3, 3, 3], [4, 5, 5, 5, 5, 5, 5, 5, 5])


def greedy(sequence: list[int]) -> int:
    """A deterministic next token (never eos): the same sequence, the same token."""
    return 3 + zlib.crc32(bytes(sequence)) % 5


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(
        policy=st.sampled_from(list(Policy)),
        slots=st.integers(1, 4),
        tight=st.booleans(),
        swap_blocks=st.sampled_from([None, 0, 4]),
        law=st.sampled_from([(0.025, 0.0002, 4e-8), (0.009, 0.0018, 1e-6), (0.01, 0.01, 0.0)]),  # GPU, CPU, all-compute
        slack=st.sampled_from([0.0, 0.25, 1.0]),
        prefix_cache=st.booleans(),
        step_tokens=st.sampled_from([6, 24]),  # 24: prompts that start alike are admitted into one step
    )
    def setup(self, policy, slots, tight, swap_blocks, law, slack, prefix_cache, step_tokens):
        # A tight pool forces memory-pressure paths; a roomy one lets the
        # preemption guarantee be checked strictly.
        self.tight = tight
        self.blocks = 12 if tight else 400
        self.events: list[Event] = []
        self.sched = Scheduler(
            SchedulerConfig(
                slots=slots,
                policy=policy,
                step_tokens=max(slots, step_tokens),
                aging_s=0.5,
                swap_blocks=swap_blocks,
                slack=slack,
                prefix_cache=prefix_cache,
            ),
            BlockPool(self.blocks, 4),
            eos_token_ids=[EOS],
            emit=self.events.append,
            cost=StepCost(*law),
        )
        self.now = 0.0
        self.submitted: list = []
        self.lent: dict[str, int] = {}
        self.kv: dict[int, dict[int, tuple[int, int]]] = {}  # block -> offset -> (position, token): the shadow engine
        self.host: dict[int, list[dict[int, tuple[int, int]]]] = {}  # turn -> swapped-out blocks
        self.copies = 0

    @rule(agent=st.sampled_from(sorted(AGENTS)), prompt=st.sampled_from(PROMPTS), cut=st.integers(1, 9), max_tokens=st.integers(0, 12))
    def submit(self, agent, prompt, cut, max_tokens):
        self.submitted.append(self.sched.submit(agent, AGENTS[agent], prompt[:cut], max_tokens, self.now))

    @rule(
        agents=st.lists(st.sampled_from(sorted(AGENTS)), min_size=2, max_size=3), tails=st.lists(st.integers(0, 4), min_size=3, max_size=3)
    )
    def submit_together(self, agents, tails):
        """Turns that arrive at once with a prefix nothing has computed yet (as
        agents sharing a system prompt do): one computes it, the others wait a step
        for its blocks."""
        self.fresh = getattr(self, "fresh", 100) % 250 + 1
        for agent, tail in zip(agents, tails, strict=False):
            prompt = [self.fresh] * 8 + [4] * tail
            self.submitted.append(self.sched.submit(agent, AGENTS[agent], prompt, 3, self.now))

    @rule(eos=st.lists(st.booleans(), max_size=8), more=st.integers(0, 6))
    def step(self, eos, more):
        self.step_once(eos)
        for _ in range(more):  # (runs of steps let turns finish and their blocks be reused)
            self.step_once([])

    def step_once(self, eos):
        plan = self.sched.schedule(self.now)
        if self.sched.policy.preempts and not self.tight:
            self.check_preemption_guarantee()
        self.check_shaping(plan)
        assert len({w.turn for w in plan.works}) == len(plan.works)
        self.run_on_shadow(plan)
        tokens = [
            (EOS if i < len(eos) and eos[i] else greedy(t.prompt + t.output)) if w.sample else None
            for i, (w, t) in enumerate(zip(plan.works, plan.turns, strict=False))
        ]
        self.now += 0.1
        self.sched.postprocess(plan, tokens, self.now)

    def run_on_shadow(self, plan):
        size = self.sched.pool.block_size
        for i, move in enumerate(plan.moves):  # in the order decided, as the GPU owner runs them
            if isinstance(move, SwapOut):
                assert len(move.blocks) == -(-move.length // size)
                self.host[move.turn] = [dict(self.kv.get(b, {})) for b in move.blocks]
            elif isinstance(move, SwapIn):
                copies = self.host.pop(move.turn)
                assert len(copies) == len(move.blocks)
                for block, copy in zip(move.blocks, copies, strict=False):
                    self.kv[block] = dict(copy)
            elif isinstance(move, Copy):
                # Its target is its turn's own block at this point of the plan: the
                # turn still holds it alone, or a later move swaps it out with the
                # turn's other blocks (the turn was paused for memory after the copy;
                # the block may be another's by the step, which writes it first).
                turn = self.sched.turns[move.turn]
                if move.target in turn.blocks:
                    assert self.sched.pool.refs(move.target) == 1 and not self.sched.pool.is_cached(move.target), (
                        "copied into a shared block"
                    )
                else:
                    assert any(isinstance(m, SwapOut) and m.turn == move.turn and move.target in m.blocks for m in plan.moves[i + 1 :]), (
                        "copied into a block its turn let go"
                    )
                self.kv[move.target] = dict(self.kv.get(move.source, {}))
                self.copies += 1
            else:
                self.host.pop(move.turn, None)
        for work, turn in zip(plan.works, plan.turns, strict=False):
            sequence = turn.prompt + turn.output
            assert work.tokens, "a step item must compute at least one token"
            for p in range(work.start):  # what attention reads: K/V depends on the position too
                assert self.kv[work.block_table[p // size]][p % size] == (p, sequence[p]), (turn.id, p)
            for p, token in enumerate(work.tokens, work.start):  # what the step writes
                block = work.block_table[p // size]
                assert self.sched.pool.refs(block) == 1 and not self.sched.pool.is_cached(block), "wrote a shared block"
                assert token == sequence[p]
                self.kv.setdefault(block, {})[p % size] = (p, token)

    @precondition(lambda self: self.sched.turns)
    @rule(data=st.data())
    def cancel(self, data):
        turn_id = data.draw(st.sampled_from(sorted(self.sched.turns)))
        self.sched.cancel(turn_id, self.now)

    @rule(agent=st.sampled_from(["docs", "review", "tests"]), priority=st.sampled_from([None, 3, FOREGROUND]))
    def lend(self, agent, priority):
        self.sched.set_inherited(agent, priority, self.now)
        if priority is None:
            self.lent.pop(agent, None)
        else:
            self.lent[agent] = priority

    @rule(seconds=st.sampled_from([0.3, 2.0]))
    def wait(self, seconds):
        self.now += seconds

    def check_shaping(self, plan):
        """With a turn above background priority live, background work in a step
        (decodes, prefill) stays within (1 + slack) of the cost of the step without it."""
        sched = self.sched
        levels = [sched.priorities.unaged(t) for t in sched.turns.values()]
        top = max(levels, default=0)
        if not sched.policy.preempts or top <= 0:
            return
        mine = [w for w, t in zip(plan.works, plan.turns, strict=False) if sched.priorities.unaged(t) >= top]
        theirs = [w for w, t in zip(plan.works, plan.turns, strict=False) if sched.priorities.unaged(t) < top]
        if not mine:
            return  # nothing protected could run (memory): the step is unshaped
        assert sum(len(w.tokens) for w in theirs if len(w.tokens) > 1) <= sched.config.step_tokens
        cost = sched.cost
        assert cost.predict(*step_features(plan.works)) <= (1 + sched.config.slack) * cost.predict(*step_features(mine)) + 1e-12

    def check_preemption_guarantee(self):
        """Under a preemptive policy with room to spare, right after a boundary no
        waiting turn outranks a running one."""
        running = list(self.sched.running.values())
        if len(running) < self.sched.config.slots:
            assert not self.sched.waiting
            return
        lowest = min(self.sched.effective(t, self.now) for t in running)
        for turn in self.sched.waiting:
            assert self.sched.effective(turn, self.now) <= lowest

    @invariant()
    def the_ranking_is_by_priority_then_admission(self):
        """Scheduler.ranked is kept between changes: it must equal a fresh sort."""
        running = self.sched.running.values()
        fresh = sorted(running, key=lambda t: (-self.sched.effective(t, self.now), t.last_admit))
        assert self.sched.ranked(self.now) == fresh

    @invariant()
    def slots_are_never_oversubscribed(self):
        assert len(self.sched.running) <= self.sched.config.slots
        for slot, turn in self.sched.running.items():
            assert turn.slot == slot and 0 <= slot < self.sched.config.slots

    def teardown(self):
        """End every turn: then nothing may be held, on the device or the host."""
        for turn_id in list(self.sched.turns):
            self.sched.cancel(turn_id, self.now)
        pool = self.sched.pool
        assert pool.num_free == self.blocks and all(pool.refs(b) == 0 for b in range(self.blocks))
        assert self.sched.swapped_blocks == 0

    @invariant()
    def kv_blocks_are_conserved(self):
        """Every block is free, cached or owned; an owned block's reference count is
        the number of tables holding it, and only a cached block is shared."""
        pool = self.sched.pool
        held = Counter(b for t in self.sched.turns.values() for b in t.blocks)
        for block in range(self.blocks):
            assert pool.refs(block) == held.get(block, 0) >= 0
        assert all(pool.is_cached(b) for b, n in held.items() if n > 1)
        assert len(held) + pool.num_free == self.blocks
        host = sum(t.host_blocks(pool.block_size) for t in self.sched.turns.values() if t.status is Status.SWAPPED)
        assert host == self.sched.swapped_blocks

    @invariant()
    def each_ended_turn_has_exactly_one_terminal_event(self):
        ends = Counter(e.turn for e in self.events if isinstance(e, Ended))
        assert all(n == 1 for n in ends.values())
        for turn in self.submitted:
            assert ends[turn.id] == (1 if turn.done else 0)
            assert (turn.id in self.sched.turns) == (not turn.done)

    @invariant()
    def equals_never_preempt(self):
        for e in self.events:
            if isinstance(e, Preempted) and e.by_turn is not None and e.reason != "memory":
                assert e.by_priority > e.priority

    @invariant()
    def priority_is_the_loan_or_the_aged_base(self):
        cap = self.sched.config.aging_cap
        for turn in self.sched.turns.values():
            levels = turn.aging_kept if turn.slot is not None else int((self.now - turn.waiting_since) / 0.5)
            aged = max(turn.priority, min(cap, turn.priority + levels))
            assert self.sched.effective(turn, self.now) == max(aged, self.lent.get(turn.agent, aged))


TestScheduler = SchedulerMachine.TestCase
TestScheduler.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)


@settings(max_examples=60, deadline=None)
@given(
    moves=st.lists(st.tuples(st.sampled_from(["submit", "step", "step", "step"]), st.integers(1, 12), st.integers(1, 9)), max_size=60),
    policy=st.sampled_from([p for p in Policy if p.preempts]),
)
def test_without_a_protected_turn_shaping_changes_nothing(moves, policy):
    """Background-only load: the shaped and the unshaped scheduler plan alike."""
    law = StepCost(0.009, 0.0018, 1e-6)
    twins = [
        Scheduler(SchedulerConfig(slots=3, policy=policy, step_tokens=6, shaping=shaping), BlockPool(60, 4), eos_token_ids=[EOS], cost=law)
        for shaping in (True, False)
    ]
    now = 0.0
    for i, (move, prompt, tokens) in enumerate(moves):
        if move == "submit":
            for sched in twins:
                sched.submit(["docs", "review"][i % 2], 0, [5] * prompt, tokens, now)
            continue
        plans = [sched.schedule(now) for sched in twins]
        assert [(w.turn, w.tokens, w.start) for w in plans[0].works] == [(w.turn, w.tokens, w.start) for w in plans[1].works]
        now += 0.1
        for sched, plan in zip(twins, plans, strict=False):
            sched.postprocess(plan, [7 if w.sample else None for w in plan.works], now)
