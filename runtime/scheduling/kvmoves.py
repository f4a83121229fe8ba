"""The scheduler's K/V memory: growing a turn's blocks, and freeing others' for it.

When the pool is short, lower-priority K/V makes room: paused turns' first, then
running turns' not yet in this step's batch (paused to free memory). Freed K/V is
swapped out to host memory while the room there lasts (`swap_blocks`), else
dropped and recomputed on resume. Every copy is a move in the plan, run before
the step in the order decided.

`KVMemory` is a part the scheduler owns. It keeps the count of host blocks in
use; it reads who runs and who waits, and pauses a running turn for memory,
through the scheduler it is given (`Seats`). Nothing here decides who runs,
only whose K/V stays.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from runtime.events.kinds import Event, Recomputed, SwappedOut
from runtime.scheduling.blocks import BlockPool
from runtime.scheduling.inflight import InFlight
from runtime.scheduling.prefix import PrefixCache
from runtime.scheduling.priority import Priorities
from runtime.scheduling.turns import Copy, Forget, Plan, Policy, SchedulerConfig, Status, SwapIn, SwapOut, Turn
from runtime.scheduling.units import ceil_div


class Seats(Protocol):
    """What the K/V memory asks of the scheduler: who holds a slot, who waits,
    and pausing a running turn to free memory."""

    @property
    def running(self) -> dict[int, Turn]: ...

    @property
    def waiting(self) -> list[Turn]: ...

    def preempt(self, victim: Turn, by: Turn | None, now: float, plan: Plan, *, memory: bool = False) -> None: ...


class KVMemory:
    def __init__(
        self,
        config: SchedulerConfig,
        pool: BlockPool,
        prefix: PrefixCache,
        in_flight: InFlight,
        priorities: Priorities,
        seats: Seats,
        emit: Callable[[Event], None],
        about: Callable[[Turn, float], tuple[Any, ...]],
    ) -> None:
        self.config = config
        self.policy = config.policy
        self.pool = pool
        self.prefix = prefix
        self.in_flight = in_flight  # K/V a step in flight writes counts as there: a move runs after it lands
        self.priorities = priorities
        self.seats = seats
        self.emit = emit
        self._about = about  # the fields every event about a turn starts with, by position
        self.swapped_blocks = 0  # host memory in use, in blocks

    def lose(self, turn: Turn, plan: Plan, now: float) -> None:
        """A KV move of this plan failed for the turn: whatever copy it had is gone.
        It is re-prefilled from its tokens (nothing is lost but time), and its share
        of this plan's step is dropped, since that assumed the cache."""
        if turn in plan.turns:
            i = plan.turns.index(turn)
            del plan.turns[i], plan.works[i]
        self._forget_kv(turn)
        if turn.status is Status.SWAPPED:
            self.swapped_blocks -= turn.host_blocks(self.pool.block_size)
            turn.status, turn.swapped_len, turn.swap_kept = Status.DROPPED, 0, []  # kv.recomputed when it resumes
        elif turn.status is not Status.DROPPED:  # (a dropped turn holds nothing, and starts over at resume)
            # Its blocks hold nothing it can trust: start over, from the cache.
            self.prefix.unsettle(turn)
            self.pool.release(turn.blocks)
            turn.cached_tokens = self.prefix.reuse(turn)
            if turn.status is Status.RUNNING:
                tokens = self.in_flight.length(turn) - turn.cached_tokens
                self.emit(Recomputed(*self._about(turn, now), tokens=tokens, cached_tokens=turn.cached_tokens))

    def release_host(self, turn: Turn) -> None:
        """A swapped-out turn ended: its host copy is freed."""
        self.swapped_blocks -= turn.host_blocks(self.pool.block_size)

    def swap_in(self, turn: Turn, now: float, plan: Plan) -> bool:
        """Bring a swapped-out turn's KV back: the shared blocks it left on the device
        by their keys, the rest from host memory into fresh blocks. False if the pool
        cannot make room now. If a block it left behind has been evicted since, the
        host copy is void and the turn is recomputed instead (Status.DROPPED)."""
        kept = self.prefix.restore(turn, turn.swap_kept)
        size = self.pool.block_size
        if kept is None:
            self.swapped_blocks -= turn.host_blocks(size)
            plan.moves.append(Forget(turn.id))
            self._forget_kv(turn)
            turn.swap_kept, turn.status = [], Status.DROPPED
            return True
        fresh: list[int] = []
        if not self.reserve(fresh, turn.host_blocks(size) * size, now, plan, keep=turn):
            self.pool.release(kept)
            return False
        self.swapped_blocks -= len(fresh)
        if fresh:
            plan.moves.append(SwapIn(turn.id, list(fresh)))
        kept_at = dict(zip(turn.swap_kept, kept, strict=False))
        fresh.reverse()
        turn.blocks = [kept_at[i] if i in kept_at else fresh.pop() for i in range(len(kept) + len(fresh))]
        turn.status, turn.committed = Status.PAUSED, 0
        return True

    def reserve(self, table: list[int], positions: int, now: float, plan: Plan, keep: Turn) -> bool:
        """Grow `table` to `positions`, evicting lower-priority KV when the pool is
        short: paused turns first, then running ones not yet batched. If the turn
        asking is itself the lowest, it is paused instead (and False returned)."""
        victim_of = self.priorities.victim
        while not self.pool.grow(table, positions):
            paused = [t for t in self.seats.waiting if t.blocks and t is not keep]
            victim = victim_of(paused, now)
            if victim is None or self.priorities.effective(victim, now) > self.priorities.effective(keep, now):
                batched = set(plan.turns)
                candidates = [
                    t
                    for t in self.seats.running.values()
                    if t not in batched and self.priorities.effective(t, now) <= self.priorities.effective(keep, now)
                ]
                victim = victim_of(candidates, now)
                if victim is None:
                    return False
                if victim.status is Status.RUNNING:
                    self.seats.preempt(victim, None if victim is keep else keep, now, plan, memory=True)
            self.evict(victim, now, plan)
            if victim is keep:
                return False
        return True

    def evict(self, turn: Turn, now: float, plan: Plan) -> None:
        """Free a turn's device blocks: swap them out while host room lasts, else drop."""
        if not turn.blocks:
            return
        computed = self.in_flight.computed(turn)
        if computed == 0:  # nothing in them yet: nothing to keep
            self.pool.release(turn.blocks)
            return
        size = self.pool.block_size
        n = ceil_div(computed, size)
        # Blocks other turns hold stay on the device anyway: leave them, take them
        # back by their keys at swap-in.
        kept = self.prefix.shared_blocks(turn, n)
        copied = n - len(kept)
        cap = self.config.swap_blocks
        if self.policy is not Policy.RECOMPUTE and (cap is None or self.swapped_blocks + copied <= cap):
            if copied:
                skip = set(kept)
                blocks = [b for i, b in enumerate(turn.blocks[:n]) if i not in skip]
                plan.moves.append(SwapOut(turn.id, blocks, computed - len(kept) * size))
            turn.swapped_len, turn.swap_kept = computed, kept
            turn.status = Status.SWAPPED
            self.swapped_blocks += copied
            self.prefix.settle(turn)
            self.pool.release(turn.blocks)
            plan.moved.append(SwappedOut(*self._about(turn, now), blocks=copied))
        else:
            self.drop(turn, plan)

    def drop(self, turn: Turn, plan: Plan) -> None:
        """Free a turn's device blocks, and forget what they hold: it is recomputed
        when it resumes."""
        # A copy this plan made into its blocks is taken back: it would fill a
        # block that is no longer the turn's (whoever takes it next writes it
        # first), for K/V nobody reads.
        if plan.moves:
            plan.moves[:] = [m for m in plan.moves if not (isinstance(m, Copy) and m.turn == turn.id)]
        self.prefix.settle(turn)
        self.pool.release(turn.blocks)
        self._forget_kv(turn)
        turn.status = Status.DROPPED

    def _forget_kv(self, turn: Turn) -> None:
        """Nothing of the turn's K/V counts any more, nor what steps in flight write."""
        turn.computed = 0
        self.in_flight.forget_kv(turn)
