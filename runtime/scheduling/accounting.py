"""Accounting for a step: what the tokens it sampled do to their turns.

`postprocess` takes a step's tokens: it extends each turn's output and K/V,
registers the blocks it filled with the prefix cache, and ends a turn on
end-of-sequence, `max_tokens` or the context. `advance` lets a step be
accounted in two halves, so the next step can be planned while it runs.

`Accounting` is a part the scheduler owns; it ends a turn through the
`finish` it is given (the scheduler's), and the scheduler counts the steps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from runtime.scheduling.prefix import PrefixCache
from runtime.scheduling.turns import UNKNOWN, Plan, SchedulerConfig, Status, Turn


class Accounting:
    def __init__(
        self, config: SchedulerConfig, prefix: PrefixCache, eos: Iterable[int], finish: Callable[[Turn, str, float], None]
    ) -> None:
        self.config = config
        self.prefix = prefix
        self.eos = frozenset(eos)
        self._finish = finish  # ends a turn as Finished, for a reason

    def advance(self, plan: Plan) -> None:
        """Account a step that has just been launched as if it had run, before its
        tokens are known, so that the next step can be planned while it runs (the
        GPU owner's overlap, as vLLM's async scheduling and SGLang's overlap
        scheduler do). Its positions count as computed, and each sampled item owes
        its turn a token: UNKNOWN in the turn's output until `postprocess` of this
        plan puts the sampled one there. A decode planned on an owed token feeds
        UNKNOWN, and whoever runs the steps puts the token there before that step
        starts. A turn whose owed token is its last by length or context has no
        more work; one that ends on end-of-sequence is only known to at
        postprocess, and its work in the step after is thrown away."""
        for work, turn in zip(plan.works, plan.turns, strict=False):
            n = len(work.tokens)
            turn.computed += n
            turn.flying += n
            if work.sample:
                turn.output.append(UNKNOWN)
                turn.owed += 1
        plan.advanced = True

    def repeat(self, plan: Plan, tokens: Sequence[int | None], times: int, now: float) -> None:
        """The plan's step ran `times` more times, each item decoding its token
        again (Scheduler.repeatable): before `postprocess` accounts the last."""
        for work, turn, token in zip(plan.works, plan.turns, tokens, strict=False):
            if turn.status is not Status.RUNNING:
                continue
            turn.computed += times
            if work.sample and token is not None:
                if not turn.output:
                    turn.first_token_at = now
                turn.output.extend([token] * times)

    def retract(self, plan: Plan) -> None:
        """Undo `advance` for a step that counts for nothing after all (abandoned,
        runtime.owner.abandon: what it wrote is written again when its work runs again).
        Of two steps in flight, the later is retracted first."""
        for work, turn in zip(plan.works, plan.turns, strict=False):
            if turn.status is Status.ENDED:
                continue
            n = len(work.tokens)
            if turn.flying >= n:  # (else its K/V was dropped since, and nothing of it counts already)
                turn.computed -= n
                turn.flying -= n
            if work.sample and turn.owed:
                turn.output.pop()  # (its last UNKNOWN: a later step's is gone already)
                turn.owed -= 1

    def postprocess(self, plan: Plan, tokens: Sequence[int | None], now: float) -> list[tuple[Turn, int]]:
        """Account one step; return the sampled tokens to deliver, in batch order.
        A plan `advance`d is only given its tokens here; a turn paused since still
        takes its token (it was sampled before the pause), an ended one does not."""
        advanced = plan.advanced
        delivered = []
        commit, eos, max_context, finish = (
            self.prefix.commit,
            self.eos,
            self.config.max_context,
            self._finish,
        )  # (once per step, not per turn)
        for work, turn, token in zip(plan.works, plan.turns, tokens, strict=False):
            status = turn.status
            if status is Status.ENDED:
                continue
            n = len(work.tokens)
            if advanced:
                turn.flying = max(0, turn.flying - n)  # (0 already if its K/V was dropped since)
            else:
                turn.computed += n
            if n > 1 or work.start < len(turn.prompt):
                turn.prefilled += n  # (not a decode: its prompt, or a recompute)
            sampled = work.sample and token is not None
            if sampled:
                if turn.first_token_at is None:
                    turn.first_token_at = now
                if advanced:
                    turn.output[work.start + n - len(turn.prompt)] = token
                    turn.owed -= 1
                else:
                    turn.output.append(token)
                turn.token_times.append(now)
            if status.resident:
                commit(turn)  # (after the output: the simulator's fast-forwarded steps fed it)
            if not sampled:
                continue
            delivered.append((turn, token))
            if token in eos and not turn.ignore_eos:
                finish(turn, "eos", now)
            elif len(turn.output) - turn.owed >= turn.max_tokens:
                finish(turn, "length", now)
            elif max_context and turn.length - turn.owed >= max_context:
                finish(turn, "context", now)
        return delivered
