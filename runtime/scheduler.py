"""The token-boundary scheduler: a plain, synchronous, deterministic object.

State in, decision out. The GPU owner, the simulator and the tests all drive it the
same way, once per token boundary:

    plan = scheduler.schedule(now)         # admit, preempt, resume; pick the batch
    tokens = engine.step(plan.works)       # (after plan.moves, in order)
    scheduler.postprocess(plan, tokens, now)

Between boundaries the caller may `submit`, `cancel`, `fail` and `set_inherited`.
Every decision is reported through `emit` as one of `runtime.events`' kinds.

The effective priority of a turn is the highest of its agent's base priority (aged
while it waits, see SchedulerConfig) and the priority lent to the requests it
serves by agents waiting on them (`set_inherited`). Preemption happens only for a strictly higher effective priority, and
the victim is the lowest effective priority, latest admitted.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Iterable, Sequence

from runtime.blocks import BlockPool
from runtime.cost import StepCost
from runtime.engine import GREEDY, Sampling, Work
from runtime.errors import UsageError
from runtime.events import (
    Admitted, Cancelled, Ended, Event, Failed, Finished, Preempted, Queued, Recomputed, Resumed, SwappedIn,
    SwappedOut,
)
from runtime.prefix import PrefixCache
from runtime.priority import BACKGROUND
from runtime.shaping import StepBudget, protected_level
from runtime.turns import KV, Forget, Plan, Policy, SchedulerConfig, SwapIn, SwapOut, Turn


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
    ) -> None:
        self.vocab_size = vocab_size  # token ids at or past it fail their own turn at submit
        self.config = config
        # What a step costs (runtime.cost): the input step shaping decides by. The
        # default makes batching free, so without a measured law only background
        # prefill is held back for the foreground.
        self.cost = cost or StepCost(fixed_s=1.0)
        self.policy = config.policy
        self.pool = blocks
        self.prefix = PrefixCache(blocks, config.prefix_cache)
        self.eos = frozenset(eos_token_ids)
        self.emit = emit
        self.step = 0
        self.running: dict[int, Turn] = {}  # slot -> turn
        self.waiting: list[Turn] = []  # queued and paused turns
        self.turns: dict[int, Turn] = {}  # every live turn by id
        self.inherited: dict[str, int] = {}
        self.swapped_blocks = 0
        self._ids = itertools.count(1)
        self._admissions = itertools.count(1)

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
    ) -> Turn:
        """Queue a turn. A turn that can never run ends at once in turn.failed.
        `lifts` name the requests it serves (see `set_inherited`)."""
        turn_id = next(self._ids) if turn_id is None else turn_id
        if turn_id in self.turns:
            raise UsageError(f"turn id {turn_id} is already live")
        turn = Turn(turn_id, agent, priority, list(prompt), max_tokens, sampling, ignore_eos, arrived=now, waiting_since=now, lifts=(agent, *lifts))
        self.turns[turn.id] = turn
        self.emit(Queued(**self._about(turn, now), tokens=len(turn.prompt)))
        problem = self._unrunnable(turn)
        if problem:
            self._end(turn, Failed, problem, now)
        else:
            self.waiting.append(turn)
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

    def lose_kv(self, plan: Plan, turn_id: int, now: float) -> None:
        """A KV move of this plan failed for the turn: whatever copy it had is gone.
        It is re-prefilled from its tokens (nothing is lost but time), and its share
        of this plan's step is dropped, since that assumed the cache."""
        turn = self.turns.get(turn_id)
        if turn is None:
            return
        if turn in plan.turns:
            i = plan.turns.index(turn)
            del plan.turns[i], plan.works[i]
        turn.computed = 0
        if turn.kv is KV.SWAPPED:
            self.swapped_blocks -= self._host_blocks(turn)
            turn.kv, turn.swapped_len, turn.swap_kept = KV.DROPPED, 0, []  # kv.recomputed when it resumes
        else:
            # Its blocks hold nothing it can trust: start over, from the cache.
            self.pool.release(turn.blocks)
            turn.cached_tokens = self.prefix.reuse(turn)
            if turn.slot is not None:
                self.emit(Recomputed(**self._about(turn, now), tokens=turn.length - turn.cached_tokens, cached_tokens=turn.cached_tokens))

    def set_inherited(self, lift: str, priority: int | None, now: float) -> None:
        """Turns submitted under `lift` run at least at `priority` (None: back to
        their own) until told otherwise: an agent's name lifts all its turns, a
        lift key (runtime.waits.lift_key) only those serving one request. Takes
        effect at the next `schedule`."""
        if priority is not None and (not isinstance(priority, int) or isinstance(priority, bool)):
            raise UsageError(f"inherited priority of {lift!r} must be an int or None, got {priority!r}")
        if priority is None:
            self.inherited.pop(lift, None)
        else:
            self.inherited[lift] = priority

    def _lent(self, turn: Turn, base: int) -> int:
        return max([base, *(self.inherited[k] for k in turn.lifts if k in self.inherited)])

    # ------------------------------------------------------------ priorities

    def effective(self, turn: Turn, now: float) -> int:
        base = turn.priority
        if base < self.config.aging_cap:
            # A waiting turn ages; a running one keeps what it had aged to when
            # admitted, so the turn it displaced cannot displace it straight back.
            aged = turn.boost if turn.slot is not None else self._aged(turn, now)
            base = min(base + aged, self.config.aging_cap)
        return self._lent(turn, base)

    def _aged(self, turn: Turn, now: float) -> int:
        return int((now - turn.waiting_since) / self.config.aging_s)

    def next_aging(self, now: float) -> float | None:
        """When the next waiting turn gains an aging level (the simulator skips ahead
        no further than this)."""
        times = [
            turn.waiting_since + (int((now - turn.waiting_since) / self.config.aging_s) + 1) * self.config.aging_s
            for turn in self.waiting
            if self.effective(turn, now) < self.config.aging_cap
        ]
        return min(times, default=None)

    def _queue_order(self, now: float) -> list[Turn]:
        if self.policy is Policy.FCFS:
            return sorted(self.waiting, key=lambda t: t.arrived)
        return sorted(self.waiting, key=lambda t: (-self.effective(t, now), t.arrived))

    def _victim(self, now: float, among: Iterable[Turn]) -> Turn | None:
        """Lowest effective priority; among equals, the latest admitted."""
        return min(among, key=lambda t: (self.effective(t, now), -t.last_admit), default=None)

    # ------------------------------------------------------------- schedule

    def schedule(self, now: float) -> Plan:
        plan = Plan()
        for turn in self._queue_order(now):
            free = self._free_slot()
            if free is None:
                if not self.policy.preempts:
                    break
                victim = self._victim(now, self.running.values())
                if victim is None or self.effective(turn, now) <= self.effective(victim, now):
                    break
                free = victim.slot
                self.preempt(victim, turn, now, plan)
            if not self._admit(turn, free, now, plan):
                break
        self._batch(now, plan)
        return plan

    def preempt(self, victim: Turn, by: Turn | None, now: float, plan: Plan) -> None:
        """Pause a running turn at this token boundary. `by` is the turn taking its
        slot, or None when it is paused to free KV memory."""
        if by is None or by is victim:
            self.emit(Preempted(**self._about(victim, now), tokens=len(victim.output), reason="memory"))
        else:
            self.emit(Preempted(**self._about(victim, now), tokens=len(victim.output), by_turn=by.id, by_agent=by.agent, by_priority=self.effective(by, now)))
        self._unslot(victim, now)
        victim.preemptions += 1
        plan.preemptions += 1
        if self.policy is Policy.SWAP:
            self._evict(victim, now, plan)
        elif self.policy is Policy.RECOMPUTE:
            self._drop(victim)

    def _admit(self, turn: Turn, slot: int, now: float, plan: Plan) -> bool:
        swapped = turn.kv is KV.SWAPPED
        if swapped and not self._swap_in(turn, now, plan):
            return False
        recomputed = turn.kv is KV.DROPPED
        if recomputed or (turn.kv is KV.RESIDENT and not turn.blocks and turn.computed == 0):
            turn.kv = KV.RESIDENT
            turn.cached_tokens = self.prefix.reuse(turn)
        self.waiting.remove(turn)
        self.running[slot] = turn
        turn.boost = self._aged(turn, now)
        turn.slot = slot
        turn.last_admit = next(self._admissions)
        if turn.admitted_at is None:
            turn.admitted_at = now
            self.emit(Admitted(**self._about(turn, now), waited_s=now - turn.arrived, cached_tokens=turn.cached_tokens))
        else:
            paused = now - turn.paused_at
            turn.paused_s += paused
            turn.paused_at = None
            self.emit(Resumed(**self._about(turn, now), paused_s=paused))
            if recomputed:
                self.emit(Recomputed(**self._about(turn, now), tokens=turn.length - turn.cached_tokens, cached_tokens=turn.cached_tokens))
            elif swapped:
                self.emit(SwappedIn(**self._about(turn, now), blocks=len(turn.blocks) - len(turn.swap_kept)))
        return True

    def _swap_in(self, turn: Turn, now: float, plan: Plan) -> bool:
        """Bring a swapped-out turn's KV back: the shared blocks it left on the device
        by their keys, the rest from host memory into fresh blocks. False if the pool
        cannot make room now. If a block it left behind has been evicted since, the
        host copy is void and the turn is recomputed instead (KV.DROPPED)."""
        kept = self.prefix.restore(turn, turn.swap_kept)
        if kept is None:
            self.swapped_blocks -= self._host_blocks(turn)
            plan.moves.append(Forget(turn.id))
            turn.computed, turn.swap_kept, turn.kv = 0, [], KV.DROPPED
            return True
        fresh: list[int] = []
        if not self._reserve(fresh, self._host_blocks(turn) * self.pool.block_size, now, plan, keep=turn):
            self.pool.release(kept)
            return False
        self.swapped_blocks -= len(fresh)
        if fresh:
            plan.moves.append(SwapIn(turn.id, list(fresh)))
        kept_at = dict(zip(turn.swap_kept, kept))
        fresh.reverse()
        turn.blocks = [kept_at[i] if i in kept_at else fresh.pop() for i in range(len(kept) + len(fresh))]
        turn.kv, turn.committed = KV.RESIDENT, 0
        return True

    def _host_blocks(self, turn: Turn) -> int:
        """Blocks of a swapped-out turn that live in host memory."""
        return self.pool.blocks_for(turn.swapped_len) - len(turn.swap_kept)

    def _batch(self, now: float, plan: Plan) -> None:
        """Pick this step's work: every decode first (one token each), then prefill
        chunks in priority order from what is left of the token budget. While a
        turn above background priority is live, the step is shaped for it instead."""
        level = self._protected_level()
        if level is not None and self._batch_shaped(level, now, plan):
            return
        budget = self.config.step_tokens
        for turn in self._batch_order(self.running.values(), now):
            if budget <= 0:
                break
            if self._take(turn, min(turn.pending, budget), now, plan):
                budget -= len(plan.works[-1].tokens)

    def _batch_shaped(self, level: int, now: float, plan: Plan) -> bool:
        """runtime.shaping: the protected turns' work, then the background work that
        fits the cost budget. False (nothing added) if no protected work can run."""
        protected = [t for t in self.running.values() if self._level(t) >= level]
        budget = StepBudget(self.cost, self.config.slack)
        chunk = max(self.config.prefill_chunk, self.config.step_tokens)
        for turn in self._batch_order(protected, now):
            start = turn.computed
            if chunk > 0 and self._take(turn, min(turn.pending, chunk), now, plan):
                n = len(plan.works[-1].tokens)
                budget.add(start, n)
                chunk -= n if n > 1 else 0
        if not plan.works:
            return False  # e.g. waiting for memory that only background progress frees
        budget.close_base()
        # Background work in what the slack leaves: decodes first (they keep running
        # turns moving), then prefill chunks cut to fit; longest-unserved first.
        others = [t for t in self.running.values() if self._level(t) < level]
        room = self.config.step_tokens
        for turn in sorted(others, key=lambda t: (t.pending > 1, -self.effective(t, now), t.last_stepped, t.last_admit)):
            n = budget.largest(turn.computed, min(turn.pending, room))
            if n and self._take(turn, n, now, plan):
                budget.add(turn.computed, n)
                room -= n if turn.pending > 1 else 0
        return True

    def _batch_order(self, turns: Iterable[Turn], now: float) -> list[Turn]:
        return sorted(turns, key=lambda t: (t.pending > 1, -self.effective(t, now), t.last_admit))

    def _take(self, turn: Turn, n: int, now: float, plan: Plan) -> bool:
        """Add `n` tokens of a running turn's work to the plan, growing its KV."""
        if turn.slot is None:
            return False  # preempted for memory while this batch was built
        start = turn.computed
        if len(turn.blocks) * self.pool.block_size < start + n and not self._reserve(turn.blocks, start + n, now, plan, keep=turn):
            return False  # it was paused to free memory
        tokens = [turn.token_at(start)] if n == 1 else turn.tokens(start, start + n)
        plan.works.append(Work(turn.id, tokens, start, turn.blocks, n == turn.pending, turn.sampling))
        plan.turns.append(turn)
        turn.last_stepped = self.step
        return True

    def _protected_level(self) -> int | None:
        if not (self.config.shaping and self.policy.preempts):
            return None
        return protected_level([self._level(t) for t in self.turns.values()])

    def _level(self, turn: Turn) -> int:
        """Priority without aging: what step shaping protects (aging only reorders
        background work among itself)."""
        return self._lent(turn, turn.priority)

    # ---------------------------------------------------------- postprocess

    def postprocess(self, plan: Plan, tokens: Sequence[int | None], now: float) -> list[tuple[Turn, int]]:
        """Account one step; return the sampled tokens to deliver, in batch order."""
        self.step += 1
        delivered = []
        for work, turn, token in zip(plan.works, plan.turns, tokens):
            if turn.done or turn.slot is None:
                continue
            turn.computed += len(work.tokens)
            sampled = work.sample and token is not None
            if sampled:
                if not turn.output:
                    turn.first_token_at = now
                turn.output.append(token)
                turn.token_times.append(now)
            self.prefix.commit(turn)  # (after the output: the simulator's fast-forwarded steps fed it)
            if not sampled:
                continue
            delivered.append((turn, token))
            if token in self.eos and not turn.ignore_eos:
                self._end(turn, Finished, "eos", now)
            elif len(turn.output) >= turn.max_tokens:
                self._end(turn, Finished, "length", now)
            elif self.config.max_context and turn.length >= self.config.max_context:
                self._end(turn, Finished, "context", now)
        return delivered

    # --------------------------------------------------------------- memory

    def _reserve(self, table: list[int], positions: int, now: float, plan: Plan, keep: Turn) -> bool:
        """Grow `table` to `positions`, evicting lower-priority KV when the pool is
        short: paused turns first, then running ones not yet batched. If the turn
        asking is itself the lowest, it is paused instead (and False returned)."""
        while not self.pool.grow(table, positions):
            paused = [t for t in self.waiting if t.blocks and t is not keep]
            victim = self._victim(now, paused)
            if victim is None or self.effective(victim, now) > self.effective(keep, now):
                batched = set(plan.turns)
                candidates = [t for t in self.running.values() if t not in batched and self.effective(t, now) <= self.effective(keep, now)]
                victim = self._victim(now, candidates)
                if victim is None:
                    return False
                if victim.slot is not None:
                    self.preempt(victim, None if victim is keep else keep, now, plan)
            self._evict(victim, now, plan)
            if victim is keep:
                return False
        return True

    def _evict(self, turn: Turn, now: float, plan: Plan) -> None:
        """Free a turn's device blocks: swap them out while host room lasts, else drop."""
        if not turn.blocks:
            return
        if turn.computed == 0:  # nothing in them yet: nothing to keep
            self.pool.release(turn.blocks)
            return
        n = self.pool.blocks_for(turn.computed)
        # Blocks other turns hold stay on the device anyway: leave them, take them
        # back by their keys at swap-in.
        kept = self.prefix.shared_blocks(turn, n)
        copied = n - len(kept)
        cap = self.config.swap_blocks
        if self.policy is not Policy.RECOMPUTE and (cap is None or self.swapped_blocks + copied <= cap):
            if copied:
                skip = set(kept)
                blocks = [b for i, b in enumerate(turn.blocks[:n]) if i not in skip]
                plan.moves.append(SwapOut(turn.id, blocks, turn.computed - len(kept) * self.pool.block_size))
            turn.swapped_len, turn.swap_kept = turn.computed, kept
            turn.kv = KV.SWAPPED
            self.swapped_blocks += copied
            self.pool.release(turn.blocks)
            self.emit(SwappedOut(**self._about(turn, now), blocks=copied))
        else:
            self._drop(turn)

    def _drop(self, turn: Turn) -> None:
        self.pool.release(turn.blocks)
        turn.computed = 0
        turn.kv = KV.DROPPED

    # ------------------------------------------------------------- helpers

    def _free_slot(self) -> int | None:
        for slot in range(self.config.slots):
            if slot not in self.running:
                return slot
        return None

    def _unslot(self, turn: Turn, now: float) -> None:
        del self.running[turn.slot]
        turn.slot = None
        turn.boost = 0
        turn.paused_at = now
        turn.waiting_since = now
        self.waiting.append(turn)

    def _unrunnable(self, turn: Turn) -> str | None:
        if not turn.prompt:
            return "empty prompt"
        if self.vocab_size is not None and max(turn.prompt) >= self.vocab_size:
            return f"token id {max(turn.prompt)} is outside the vocabulary of {self.vocab_size}"
        if turn.max_tokens < 1:
            return f"max_tokens must be at least 1, got {turn.max_tokens}"
        most = turn.length + turn.max_tokens
        if self.config.max_context and len(turn.prompt) >= self.config.max_context:
            return f"prompt of {len(turn.prompt)} tokens does not fit the context of {self.config.max_context}"
        if self.pool.blocks_for(min(most, self.config.max_context or most)) > self.pool.num_blocks:
            return f"needs {self.pool.blocks_for(most)} KV blocks, the pool has {self.pool.num_blocks}"
        return None

    def _end(self, turn: Turn, kind: type[Ended], reason: str, now: float) -> None:
        if turn.done:
            return
        turn.ended = kind(**self._about(turn, now), tokens=len(turn.output), reason=reason, **_latencies(turn, now, self._level(turn)))
        self.emit(turn.ended)
        if turn.slot is not None:
            del self.running[turn.slot]
            turn.slot = None
        elif turn in self.waiting:
            self.waiting.remove(turn)
        if turn.kv is KV.SWAPPED:
            self.swapped_blocks -= self._host_blocks(turn)
        self.pool.release(turn.blocks)
        del self.turns[turn.id]

    def _about(self, turn: Turn, now: float) -> dict:
        """The fields every event about a turn carries."""
        return dict(t=now, step=self.step, turn=turn.id, agent=turn.agent, priority=self.effective(turn, now), slot=turn.slot)


def _latencies(turn: Turn, now: float, level: int) -> dict[str, Any]:
    """What the turn's reader felt: time to the first token (from the request) and
    the mean gap between tokens after it, pauses included; for a turn above
    background priority (`level`: its own, or lent by whoever waits on it), also
    every token's time, so the log can replay its pace."""
    if turn.first_token_at is None:
        return {}
    felt: dict[str, Any] = {"ttft_s": turn.first_token_at - turn.arrived}
    if len(turn.output) > 1:
        felt["itl_s"] = (now - turn.first_token_at) / (len(turn.output) - 1)
    if level > BACKGROUND:
        felt["token_s"] = [round(t - turn.arrived, 4) for t in turn.token_times]
    return felt
