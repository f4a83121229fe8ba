"""The simulator's fast-forward: one plan standing for many identical decode steps.

Between events (an arrival, a turn ending, an aging tick) every step of the
simulation is the same decode step, so `swarm.sim` asks the scheduler for one plan,
`stretch`es it over as many steps as it can stand for, prices them with the timing
model, and `account`s them at once. The production scheduler knows nothing of it;
`tests/test_scheduler.py` checks that k steps at once leave the scheduler exactly
where k single steps do.
"""

from __future__ import annotations

from typing import Sequence

from runtime.scheduler import Scheduler
from runtime.turns import Plan, Status, Turn


def stretch(sched: Scheduler, plan: Plan, steps: int) -> int:
    """How many steps this plan can stand for, at most `steps`: its first step,
    then decodes of every item until the first turn ends. Each item must sample
    (the last chunk of a prefill does) and ignore eos, and the blocks of every step
    must be reservable now; they are reserved."""
    if steps <= 1 or not plan.works or plan.preemptions or plan.moves or plan.held:
        return 1  # (a KV move or flush makes the first step longer than the rest; a held prompt runs next step)
    for work, turn in zip(plan.works, plan.turns):
        if not work.sample or not turn.ignore_eos:
            return 1
        steps = min(steps, turn.max_tokens - len(turn.output))
    if steps <= 1:
        return 1
    ends = [work.start + len(work.tokens) + steps - 1 for work in plan.works]
    need = sum(turn.blocks_missing(end, sched.pool.block_size) for end, turn in zip(ends, plan.turns))
    if need > sched.pool.num_free:
        return 1
    for end, turn in zip(ends, plan.turns):
        sched.pool.grow(turn.blocks, end)
    return steps


def account(sched: Scheduler, plan: Plan, tokens: Sequence[int | None], steps: int, now: float) -> list[tuple[Turn, int]]:
    """`Scheduler.postprocess` for `steps` identical steps: the first steps - 1 are
    added here (each item decoded its token again), the last one by postprocess,
    which ends turns and returns the tokens to deliver."""
    sched.step += steps - 1
    for work, turn, token in zip(plan.works, plan.turns, tokens):
        if turn.status is not Status.RUNNING or steps == 1:
            continue
        turn.computed += steps - 1
        if work.sample and token is not None:
            if not turn.output:
                turn.first_token_at = now
            turn.output.extend([token] * (steps - 1))
    return sched.postprocess(plan, tokens, now)
