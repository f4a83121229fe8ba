"""The token-boundary scheduler: a plain, synchronous, deterministic object.

State in, decision out. The GPU owner, the simulator and the tests all drive it the
same way, once per token boundary:

    plan = scheduler.schedule(now)         # admit, preempt, resume; pick the batch
    # (plan.moves first, in order; settle_moves(plan, failed, now) if one may fail)
    tokens = engine.step(plan.works)
    scheduler.postprocess(plan, tokens, now)

or, as the GPU owner does, one step ahead: `advance(plan)` enters a step
launched in the steps in flight (runtime.scheduling.inflight), the next is planned
while it runs, and its `postprocess` lands it after; `discard(plan)` forgets one
abandoned. Turns hold only settled facts; planning reads them one step ahead
through the steps in flight.

Between boundaries the caller may `submit`, `cancel`, `fail` and `set_inherited`.
Every decision is reported through `emit` as one of `runtime.events.kinds`' kinds.

This module decides who holds a slot: admission, preemption and resumption, and
how a turn ends. It is built from parts it owns, each in its own module:
`Priorities` (runtime.scheduling.priority: the effective priority, and what is lent
through `set_inherited`), `Batching` (runtime.scheduling.batching: the work of the step),
`KVMemory` (runtime.scheduling.kvmoves: growing blocks, swapping and dropping others') and
`Accounting` (runtime.scheduling.accounting: what a step's tokens do to their turns),
and `InFlight` (runtime.scheduling.inflight: what the steps launched will add). A
turn's `status` (runtime.scheduling.turns.Status) is the one record of where it is.
Preemption happens only for a strictly higher effective priority, and the victim
is the lowest effective priority, latest admitted.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from runtime.errors import UsageError
from runtime.events.kinds import (
    Admitted,
    Cancelled,
    Ended,
    Event,
    Failed,
    Finished,
    Preempted,
    Progress,
    Queued,
    Recomputed,
    Resumed,
    SwappedIn,
    TurnEvent,
)
from runtime.events.latency import felt
from runtime.scheduling.accounting import Accounting
from runtime.scheduling.batching import Batching
from runtime.scheduling.blocks import BlockPool
from runtime.scheduling.constraints import Constraint, TurnConstraint
from runtime.scheduling.cost import StepCost
from runtime.scheduling.inflight import InFlight
from runtime.scheduling.kvmoves import KVMemory
from runtime.scheduling.prefix import PrefixCache
from runtime.scheduling.priority import BACKGROUND, Priorities
from runtime.scheduling.turns import Plan, Policy, SchedulerConfig, Status, Turn
from runtime.scheduling.work import GREEDY, Sampling

# The fields `Scheduler._about` gives every event about a turn, by position.
ABOUT = ("t", "step", "turn", "agent", "priority", "slot")
assert TurnEvent.__struct_fields__[: len(ABOUT)] == ABOUT

# A running turn's tokens so far are told (turn.progress) at most this often, in
# seconds of the swarm clock: a viewer counts a long turn before it ends, and
# the log gets a line a second per running turn, not a line per token.
PROGRESS_S = 1.0


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        blocks: BlockPool,
        *,
        eos_token_ids: Iterable[int] = (),
        vocab_size: int | None = None,
        emit: Callable[[Event], None] = lambda event: None,
        cost: StepCost | None = None,
        draft_cost: StepCost | None = None,
    ) -> None:
        self.vocab_size = vocab_size  # token ids at or past it fail their own turn at submit
        self.config = config
        # What a step costs (runtime.scheduling.cost): the input step shaping decides by. The
        # default makes batching free, so without a measured law only background
        # prefill is held back for the foreground.
        self.cost = cost or StepCost(fixed_s=1.0)
        self.policy = config.policy
        self.preempts = config.policy.preempts  # (asked every step)
        self.pool = blocks
        self.in_flight = InFlight()
        self.prefix = PrefixCache(blocks, config.prefix_cache, self.in_flight)
        self.emit = emit
        self._steps_landed = 0
        self.turns: dict[int, Turn] = {}  # every live turn by id; each turn's status says where it is
        self.priorities = Priorities(config.aging_s, config.aging_cap)
        self.memory = KVMemory(config, blocks, self.prefix, self.in_flight, self.priorities, self, emit, self._about)
        self.batching = Batching(config, self.cost, self.prefix, self.in_flight, self.priorities, self.memory, self, draft_cost)
        self.accounting = Accounting(config, self.prefix, eos_token_ids, lambda turn, reason, now: self._end(turn, Finished, reason, now))
        self._ids = itertools.count(1)
        self._admissions = itertools.count(1)
        self._enqueues = itertools.count(1)
        # Bumped by whatever changes who runs, who waits or what is lent; with
        # `_stuck`, the queue is walked only when a turn might take a slot.
        self._changes = 0
        self._stuck: tuple[int, float] | None = None  # (changes, until): no waiting turn can run before then
        # The live turns by where they are, kept as they move (asked several times a step):
        # in a slot, by slot; waiting (queued or paused), by id.
        self._slots: dict[int, Turn] = {}
        self._queue: dict[int, Turn] = {}
        self._top: tuple[int, int | None] = (-1, None)  # (changes, top_unaged): asked every step
        # The running turns in `ranked` order, kept as they take and leave a slot
        # (every round of the simulator has a turn come or go: no sort of them
        # all for it): by (-effective priority, admission order), each turn's key
        # by id; and the turns alone, made when asked. What is lent changes
        # every key: then they are ranked anew (`set_inherited`).
        self._ranks: list[tuple[int, int, Turn]] = []
        self._rank_of: dict[int, tuple[int, int, Turn]] = {}
        self._ranked: list[Turn] | None = []
        self._aging: tuple[int, float | None] = (-1, None)  # (changes, next_aging): asked every step by the simulator
        self._next_progress = 0.0  # when the running turns' progress is next told

    # ------------------------------------------------------------------ inputs

    def submit(
        self,
        agent: str,
        priority: int,
        prompt: Sequence[int],
        max_tokens: int,
        now: float,
        *,
        sampling: Sampling = GREEDY,
        ignore_eos: bool = False,
        turn_id: int | None = None,
        lifts: Sequence[str] = (),
        constraint: Constraint | None = None,
        prior_output: int = 0,
    ) -> Turn:
        """Queue a turn. A turn that can never run ends at once in turn.failed.
        `lifts` name the requests it serves (see `set_inherited`). A `constraint`
        holds its output to a grammar, from its prompt's last `prior_output`
        tokens on (output it made on an owner it was moved from)."""
        turn_id = next(self._ids) if turn_id is None else turn_id
        if turn_id in self.turns:
            raise UsageError(f"turn id {turn_id} is already live")
        turn = Turn(
            turn_id,
            agent,
            priority,
            list(prompt),
            max_tokens,
            sampling,
            ignore_eos,
            arrived=now,
            waiting_since=now,
            lifts=(agent, *lifts),
            enqueued=next(self._enqueues),
        )
        if constraint is not None:
            turn.constraint = TurnConstraint(constraint, len(turn.prompt) - prior_output, turn.tokens)
        self.turns[turn.id] = turn
        self._queue[turn.id] = turn
        self._changes += 1
        self.emit(Queued(*self._about(turn, now), tokens=len(turn.prompt)))
        problem = self._unrunnable(turn)
        if problem:
            self._end(turn, Failed, problem, now)
        return turn

    def cancel(self, turn_id: int, now: float, reason: str = "cancelled") -> bool:
        turn = self.turns.get(turn_id)
        if turn is None:
            return False
        self._end(turn, Cancelled, reason, now)
        return True

    def fail(self, turn_id: int, now: float, reason: str) -> bool:
        turn = self.turns.get(turn_id)
        if turn is None:
            return False
        self._end(turn, Failed, reason, now)
        return True

    def set_inherited(self, lift: str, priority: int | None, now: float) -> None:
        """Turns submitted under `lift` run at least at `priority` (None: back to
        their own) until told otherwise: an agent's name lifts all its turns, a
        lift key (runtime.actors.serving.lift_key) only those serving one request. Takes
        effect at the next `schedule`."""
        self.priorities.lend(lift, priority)
        self._changes += 1
        self._rerank(now)

    # ----------------------------------------------------- a step's accounts

    def settle_moves(self, plan: Plan, failed: dict[int, str], now: float) -> None:
        """The plan's KV moves were made, but for the turns in `failed`: the
        moves made are told, and a turn whose move failed has lost its cache and
        is re-prefilled (runtime.scheduling.kvmoves), its moves untold. A driver whose moves
        cannot fail need not call it: `advance` and `postprocess` tell them."""
        if failed:
            plan.moved[:] = [e for e in plan.moved if e.turn not in failed]  # type: ignore[attr-defined]
        self._tell_moves(plan)
        for turn_id in failed:
            self.lose_kv(plan, turn_id, now)

    def _tell_moves(self, plan: Plan) -> None:
        for event in plan.moved:
            self.emit(event)
        plan.moved.clear()

    @property
    def step(self) -> int:
        """Steps run or running: those landed and those in flight."""
        return self._steps_landed + len(self.in_flight.launched)

    def advance(self, plan: Plan) -> None:
        """A step was launched and its tokens are not known yet: it enters the
        steps in flight (runtime.scheduling.inflight), so the next can be planned
        while it runs. Its `postprocess` lands it."""
        if plan.moved:
            self._tell_moves(plan)
        self.in_flight.launch(plan)

    def discard(self, plan: Plan) -> None:
        """A step launched counts for nothing after all (abandoned,
        runtime.owner.abandon: what it wrote is written again when its work runs
        again): it leaves the steps in flight, and no turn has changed."""
        self.in_flight.discard(plan)

    def postprocess(
        self,
        plan: Plan,
        tokens: Sequence[int | list[int] | None],
        now: float,
        *,
        repeats: int = 1,
        drafted: Mapping[int, list[int]] | None = None,
    ) -> list[tuple[Turn, int]]:
        """Account one step; return the sampled tokens to deliver, in batch order.
        `repeats` > 1 accounts the plan as that many identical steps, as
        `repeatable` allowed (the simulator's fast-forward): the first
        repeats - 1 decode their token again, the last is accounted as usual.
        `drafted`: the drafts a draft model wrote in the step, by turn (where
        the plan holds their placeholders, runtime.owner.drafter)."""
        if plan.moved:
            self._tell_moves(plan)
        lost = self.in_flight.land(plan)  # (a launched step leaves the steps in flight as it lands)
        self._steps_landed += repeats
        return self.accounting.postprocess(plan, tokens, now, lost, drafted, repeats - 1)

    def tell_progress(self, now: float) -> None:
        """Tell each running turn's tokens so far (turn.progress) where it has
        new ones, at most once per PROGRESS_S: whoever runs the steps calls it
        after each step's `postprocess`. (A turn that ends first is counted by
        its end; the simulator, which only counts decisions, does not call it.)"""
        if now < self._next_progress:
            return
        self._next_progress = now + PROGRESS_S
        for turn in [t for t in self.turns.values() if t.status is Status.RUNNING]:  # (in the order they came)
            tokens = len(turn.output)
            if tokens > turn.told_tokens:
                turn.told_tokens = tokens
                self.emit(Progress(*self._about(turn, now), tokens=tokens))

    def repeatable(self, plan: Plan, steps: int) -> int:
        """How many identical steps this plan can stand for, at most `steps`: its
        first step, then decodes of every item until the first turn ends. Every
        running turn must have an item, each item must sample (the last chunk
        of a prefill does) and ignore eos, and the blocks of every step must be
        reservable now; they are reserved. So the steps it stands for are the
        ones planning each would make (tests/test_sim.py checks it). (The
        simulator prices them at once: swarm.sim.)"""
        if steps <= 1 or not plan.works or plan.preemptions or plan.moves or plan.held:
            return 1  # (a KV move or flush makes the first step longer than the rest; a held prompt runs next step)
        if len(plan.works) < len(self._slots):
            return 1  # (a turn left out of this step, by the token budget or the shaping, may have work in the next)
        for work, turn in zip(plan.works, plan.turns, strict=False):
            if not work.sample or work.drafts or not turn.ignore_eos:
                return 1
            left = turn.max_tokens - len(turn.output)
            if left < steps:
                steps = left
        if steps <= 1:
            return 1
        ends = [work.start + len(work.tokens) + steps - 1 for work in plan.works]
        return steps if self.pool.grow_all([turn.blocks for turn in plan.turns], ends) else 1

    def lose_kv(self, plan: Plan, turn_id: int, now: float) -> None:
        """A KV move of this plan failed for the turn: it is re-prefilled (runtime.scheduling.kvmoves)."""
        turn = self.turns.get(turn_id)
        if turn is not None:
            self.memory.lose(turn, plan, now)

    @property
    def swapped_blocks(self) -> int:
        """Host memory in use for swapped-out K/V, in blocks."""
        return self.memory.swapped_blocks

    @property
    def eos(self) -> frozenset[int]:
        return self.accounting.eos

    # ------------------------------------------------------------ the turns

    @property
    def running(self) -> dict[int, Turn]:
        """The turns in a slot, by slot (kept as turns take and leave a slot, in
        _admit, _unslot and _end: do not change it)."""
        return self._slots

    def ranked(self, now: float) -> list[Turn]:
        """The running turns, highest effective priority first, then the earliest
        admitted (the same list until who runs or what is lent changes: a running
        turn keeps the aging levels it was admitted with, so time does not
        reorder them; do not change it)."""
        ranked = self._ranked
        if ranked is None:
            ranked = self._ranked = [turn for _, _, turn in self._ranks]
        return ranked

    def ranks(self, now: float) -> list[tuple[int, int, Turn]]:
        """`ranked`, each turn with its key: (minus its effective priority, its
        admission order, the turn). Do not change it."""
        return self._ranks

    def _rank(self, turn: Turn, now: float) -> None:
        """A turn takes a slot: its place among the running ones (last_admit is
        every running turn's own, so no two keys tie)."""
        key = (-self.priorities.effective(turn, now), turn.last_admit, turn)
        bisect.insort(self._ranks, key)
        self._rank_of[turn.id] = key
        self._ranked = None

    def _unrank(self, turn: Turn) -> None:
        """A turn leaves its slot."""
        key = self._rank_of.pop(turn.id)
        del self._ranks[bisect.bisect_left(self._ranks, key)]
        self._ranked = None

    def _rerank(self, now: float) -> None:
        """What is lent has changed: every running turn's key anew."""
        effective = self.priorities.effective
        self._rank_of = {turn.id: (-effective(turn, now), turn.last_admit, turn) for turn in self.running.values()}
        self._ranks = sorted(self._rank_of.values())
        self._ranked = None

    def _victim(self, now: float) -> Turn | None:
        """The running turn a preemption pauses (Priorities.victim): the lowest
        effective priority, the latest admitted among equals, which is the last
        ranked (asked at every step while a turn waits, so read off the ranked
        turns kept)."""
        ranked = self.ranked(now)
        return ranked[-1] if ranked else None

    def top_unaged(self) -> int | None:
        """The highest unaged priority among the live turns (None if there are none)."""
        changes, top = self._top
        if changes != self._changes:
            # (a turn comes or goes, and a priority is lent, only where it counts as a change)
            top = self.priorities.top_unaged(self.turns.values())
            self._top = (self._changes, top)
        return top

    @property
    def waiting(self) -> list[Turn]:
        """The queued and paused turns, in the order they (re)joined the queue."""
        return sorted(self._not_running(), key=lambda t: t.enqueued)

    def _not_running(self) -> Collection[Turn]:
        """The waiting turns, in no particular order (kept as turns come, go, and
        take or leave a slot: do not change it)."""
        return self._queue.values()

    def effective(self, turn: Turn, now: float) -> int:
        return self.priorities.effective(turn, now)

    def next_aging(self, now: float) -> float | None:
        """When the next waiting turn gains an aging level (the simulator skips ahead
        no further than this)."""
        # It stays the answer until who waits or what is lent changes, or that time
        # comes (no waiting turn gains a level before it): remembered till then,
        # since the simulator asks at every round. (In any order, unsorted: it is a minimum.)
        changes, soonest = self._aging
        if changes == self._changes and (soonest is None or now < soonest):
            return soonest
        soonest = self.priorities.next_aging(self._not_running(), now)
        self._aging = (self._changes, soonest)
        return soonest

    # ------------------------------------------------------------- schedule

    def schedule(self, now: float) -> Plan:
        """This boundary's decisions, on the turns as they stand once the steps in
        flight land: a prompt does not compute again a block one of them computes."""
        plan = Plan()
        # (unsorted: queue_order sorts them, by keys that end in the order they joined the queue)
        waiting = [] if self._queue_stuck(now) else self._not_running()
        for turn in self.priorities.queue_order(waiting, now, by_priority=self.policy is not Policy.FCFS):
            free = self._free_slot()
            if free is None:
                if not self.preempts:
                    break
                victim = self._victim(now)
                if victim is None or self.priorities.effective(turn, now) <= self.priorities.effective(victim, now):
                    break
                free = victim.slot
                self.preempt(victim, turn, now, plan)
            if not self._admit(turn, free, now, plan):
                break
        self.batching.fill(now, plan)
        if plan.moved and not plan.moves:
            self._tell_moves(plan)  # (the shared blocks it kept: nothing to copy, nothing can fail)
        return plan

    def _queue_stuck(self, now: float) -> bool:
        """Whether no waiting turn can take a slot: none is free and none outranks
        the victim (the queue's walk would stop at its first turn). It stays so
        until who runs, who waits or what is lent changes, or a waiting turn ages
        (a running turn's priority does not change with time); it is remembered
        till then, since with every slot busy it is the question of every step."""
        if self._stuck is not None and self._stuck[0] == self._changes and now < self._stuck[1]:
            return True
        running = self._slots  # (the property `running`, read without its call: asked every step)
        if len(running) < self.config.slots:
            return False
        waiting = self._not_running()
        if self.preempts and waiting:
            victim = self._victim(now)
            bar = self.priorities.effective(victim, now) if victim is not None else None
            if bar is not None and any(self.priorities.effective(t, now) > bar for t in waiting):
                return False
        until = self.next_aging(now) if self.preempts else None
        self._stuck = (self._changes, math.inf if until is None else until)
        return True

    def preempt(self, victim: Turn, by: Turn | None, now: float, plan: Plan, *, memory: bool = False) -> None:
        """Pause a running turn at this token boundary. `by` is the turn taking its
        slot, or the one it frees KV memory for (`memory`), or None when it is
        paused to free memory for itself."""
        tokens = len(victim.output) + self.in_flight.sampling(victim)  # (it still takes the tokens in flight)
        if by is None or by is victim:
            self.emit(Preempted(*self._about(victim, now), tokens=tokens, reason="memory"))
        else:
            # (For memory a running turn of equal priority may give way: that is
            # no slot taken by a higher priority, and the reason says so.)
            self.emit(
                Preempted(
                    *self._about(victim, now),
                    tokens=tokens,
                    by_turn=by.id,
                    by_agent=by.agent,
                    by_priority=self.priorities.effective(by, now),
                    reason="memory" if memory else None,
                )
            )
        self._unslot(victim, now)
        victim.preemptions += 1
        plan.preemptions += 1
        if self.policy is Policy.SWAP:
            self.memory.evict(victim, now, plan)
        elif self.policy is Policy.RECOMPUTE:
            self.memory.drop(victim, plan)

    def _admit(self, turn: Turn, slot: int, now: float, plan: Plan) -> bool:
        swapped = turn.status is Status.SWAPPED
        if swapped and not self.memory.swap_in(turn, now, plan):
            return False
        recomputed = turn.status is Status.DROPPED
        if recomputed or (turn.status.resident and not turn.blocks and self.in_flight.computed(turn) == 0):
            turn.cached_tokens = self.prefix.reuse(turn, plan.moves)
        turn.aging_kept = self.priorities.aging_levels(turn, now)
        turn.status, turn.slot = Status.RUNNING, slot
        del self._queue[turn.id]
        self._slots[slot] = turn
        turn.last_admit = next(self._admissions)
        self._rank(turn, now)
        self._changes += 1
        if turn.admitted_at is None:
            turn.admitted_at = now
            self.emit(Admitted(*self._about(turn, now), waited_s=now - turn.arrived, cached_tokens=turn.cached_tokens))
        else:
            paused = now - turn.waiting_since
            turn.paused_s += paused
            self.emit(Resumed(*self._about(turn, now), paused_s=paused))
            if recomputed:
                tokens = self.in_flight.length(turn) - turn.cached_tokens
                self.emit(Recomputed(*self._about(turn, now), tokens=tokens, cached_tokens=turn.cached_tokens))
            elif swapped:
                plan.moved.append(SwappedIn(*self._about(turn, now), blocks=len(turn.blocks) - len(turn.swap_kept)))
        return True

    # ------------------------------------------------------------- helpers

    def _free_slot(self) -> int | None:
        running = self._slots
        for slot in range(self.config.slots):
            if slot not in running:
                return slot
        return None

    def _unslot(self, turn: Turn, now: float) -> None:
        """Back to the queue, its K/V still on the device (evicting it is the
        policy's next step)."""
        del self._slots[turn.slot]  # type: ignore[index]
        self._unrank(turn)
        self._queue[turn.id] = turn
        turn.status, turn.slot = Status.PAUSED, None
        self._changes += 1
        turn.aging_kept = 0
        turn.waiting_since = now
        turn.enqueued = next(self._enqueues)

    def _unrunnable(self, turn: Turn) -> str | None:
        if not turn.prompt:
            return "empty prompt"
        if self.vocab_size is not None and max(turn.prompt) >= self.vocab_size:
            return f"token id {max(turn.prompt)} is outside the vocabulary of {self.vocab_size}"
        if turn.max_tokens < 1:
            return f"max_tokens must be at least 1, got {turn.max_tokens}"
        if self.config.max_context and len(turn.prompt) >= self.config.max_context:
            return f"prompt of {len(turn.prompt)} tokens does not fit the context of {self.config.max_context}"
        size = self.pool.block_size
        if turn.blocks_needed(size, self.config.max_context) > self.pool.num_blocks:
            return f"needs {turn.blocks_needed(size)} KV blocks, the pool has {self.pool.num_blocks}"
        return None

    def _end(self, turn: Turn, kind: type[Ended], reason: str, now: float) -> None:
        if turn.status is Status.ENDED:  # (Turn.done, inlined)
            return
        # (What a step in flight samples for it never reaches it: an ended turn
        # takes nothing when that step lands.)
        turn.ended = kind(
            *self._about(turn, now),
            tokens=len(turn.output),
            reason=reason,
            cached_tokens=turn.cache_hits,
            computed_tokens=turn.prefilled,
            drafted_tokens=turn.drafted,
            accepted_tokens=turn.accepted,
            sampling_steps=turn.sampling_steps,
            **_latencies(turn, now, self.priorities.unaged(turn)),
        )
        self.emit(turn.ended)
        if turn.status is Status.SWAPPED:
            self.memory.release_host(turn)
        if turn.slot is not None:
            del self._slots[turn.slot]
            self._unrank(turn)
        else:
            del self._queue[turn.id]
        turn.status, turn.slot = Status.ENDED, None
        self._changes += 1
        self.prefix.settle(turn)  # (its last block's rows stay findable for a turn that repeats it)
        self.pool.release(turn.blocks)
        del self.turns[turn.id]

    def _about(self, turn: Turn, now: float) -> tuple[float, int, int, str, int, int | None]:
        """The fields every event about a turn starts with, in TurnEvent's order
        (ABOUT): passed by position, an event costs a third of what it does
        with these as keywords from a dict (a few events a round in the simulator)."""
        return now, self.step, turn.id, turn.agent, self.priorities.effective(turn, now), turn.slot


def _latencies(turn: Turn, now: float, unaged: int) -> dict[str, Any]:
    """What the turn's reader felt: time to the first token (from the request) and
    the mean gap between tokens after it, pauses included; for a turn above
    background priority (`unaged`: its own, or lent by whoever waits on it), also
    every token's time, so the log can replay its pace (runtime.events.latency)."""
    if not turn.token_times:
        return {}
    reader = felt(turn.arrived, turn.token_times, until=now)
    out: dict[str, Any] = {"ttft_s": reader.ttft_s}
    if reader.mean_gap_s is not None:
        out["itl_s"] = reader.mean_gap_s
    if unaged > BACKGROUND:
        out["token_s"] = [round(t - turn.arrived, 4) for t in turn.token_times]
    return out
