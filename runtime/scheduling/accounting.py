"""Accounting for a step: what the tokens it sampled do to their turns.

`postprocess` takes a step's tokens: it extends each turn's output and K/V,
registers the blocks it filled with the prefix cache, and ends a turn on
end-of-sequence, `max_tokens` or the context. A decode that verified drafts
keeps the tokens `drafts.accept` keeps (1 to drafts + 1), and the positions
that fed them. A step launched before its tokens
were known (the GPU owner's overlap, runtime.scheduling.inflight) changed no
turn then: it is accounted here like any other, when it lands.

`Accounting` is a part the scheduler owns; it ends a turn through the
`finish` it is given (the scheduler's), and the scheduler counts the steps.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

from runtime.scheduling.drafts import MAX_DRAFTS, MODEL, accept
from runtime.scheduling.prefix import PrefixCache
from runtime.scheduling.turns import Plan, SchedulerConfig, Status, Turn
from runtime.scheduling.work import Work


class Accounting:
    def __init__(
        self, config: SchedulerConfig, prefix: PrefixCache, eos: Iterable[int], finish: Callable[[Turn, str, float], None]
    ) -> None:
        self.config = config
        self.prefix = prefix
        self.eos = frozenset(eos)
        self._finish = finish  # ends a turn as Finished, for a reason

    def postprocess(
        self,
        plan: Plan,
        tokens: Sequence[int | list[int] | None],
        now: float,
        lost: Collection[Turn] = (),
        drafted: Mapping[int, list[int]] | None = None,
        repeated: int = 0,
    ) -> list[tuple[Turn, int]]:
        """Account one step; return the sampled tokens to deliver, in batch order.
        A step launched before (runtime.scheduling.inflight) is accounted the same
        way as it lands: a turn paused since still takes its token (it was
        sampled before the pause), an ended one does not, and one whose K/V was
        dropped since (in `lost`) gains no positions. A verify step's drafts are
        its work's last tokens, or in `drafted` where a draft model wrote them.
        `repeated`: the step ran that many more times before (Scheduler.repeatable),
        each running turn's item decoding its token again, accounted first."""
        delivered = []
        commit, eos, max_context, finish = (
            self.prefix.commit,
            self.eos,
            self.config.max_context,
            self._finish,
        )  # (once per step, not per turn)
        running, ended = Status.RUNNING, Status.ENDED
        for work, turn, token in zip(plan.works, plan.turns, tokens, strict=False):
            status = turn.status
            if status is ended:
                continue
            output = turn.output
            sampled = work.sample and token is not None
            n = len(work.tokens)
            if repeated and status is running:
                turn.computed += repeated
                if sampled:
                    if not output:
                        turn.first_token_at = now
                    output.extend([token] * repeated)  # type: ignore[list-item]
            if work.drafts:
                if work.context is not None:  # (its draft model was told these)
                    turn.draft_told = work.context_start + len(work.context)
                kept = self._keep_verified(work, turn, token, now, delivered, drafted)  # type: ignore[arg-type]
                # The positions that fed the tokens it keeps; the rest are
                # written again by later steps before anything reads them.
                n = len(kept)
                token = kept[-1] if kept else None
            elif sampled:
                if turn.lookup is not None:
                    self._check_lookup(turn, token)  # type: ignore[arg-type]
                output.append(token)  # type: ignore[arg-type]
                turn.token_times.append(now)
                delivered.append((turn, token))  # type: ignore[arg-type]
            else:
                token = None
            if not lost or turn not in lost:
                turn.computed += n
            if (n > 1 and not work.drafts) or work.start < len(turn.prompt):
                turn.prefilled += n  # (not a decode: its prompt, or a recompute)
            if token is not None:
                turn.sampling_steps += 1
                if turn.first_token_at is None:
                    turn.first_token_at = now
            if status is running or status.resident:
                commit(turn)  # (after the output: the simulator's fast-forwarded steps fed it)
            if token is None:
                continue
            if token in eos and not turn.ignore_eos:
                finish(turn, "eos", now)
            elif len(output) >= turn.max_tokens:
                finish(turn, "length", now)
            elif max_context and len(turn.prompt) + len(output) >= max_context:  # (Turn.length, inlined)
                finish(turn, "context", now)
        return delivered

    def _keep_verified(
        self,
        work: Work,
        turn: Turn,
        sampled: list[int] | None,
        now: float,
        delivered: list[tuple[Turn, int]],
        drafted: Mapping[int, list[int]] | None,
    ) -> list[int]:
        """A verify step's tokens (`sampled`: one a row, None if it failed) for
        its turn: those `drafts.accept` keeps, up to the first that ends the
        turn, appended to its output and to `delivered`."""
        if sampled is None:
            return []
        drafts = drafted.get(work.turn) if drafted else None
        kept = accept(drafts if drafts is not None else work.tokens[-work.drafts :], sampled)
        self._count_drafts(turn, work.drafts, len(kept) - 1)
        max_context = self.config.max_context
        for i, token in enumerate(kept):
            if turn.lookup is not None:  # (lookup's drafts: each token kept teaches its rate, as one sampled alone)
                self._check_lookup(turn, token)
            turn.output.append(token)
            turn.token_times.append(now)
            delivered.append((turn, token))
            ends = (
                (token in self.eos and not turn.ignore_eos)
                or len(turn.output) >= turn.max_tokens
                or (max_context and turn.length >= max_context)
            )
            if ends:
                return kept[: i + 1]
        return kept

    @staticmethod
    def _check_lookup(turn: Turn, token: int) -> None:
        """A token a turn that may speculate samples, drafted or not: would
        lookup's guess for it have been kept? (So the turn's rates learn from
        every token, at every length of run, also while drafts do not pay, at
        no device cost.)"""
        lookup = turn.lookup
        assert lookup is not None
        lookup.extend(turn.tokens(lookup.fed, turn.length))
        guess, match = lookup.proposal(MAX_DRAFTS)
        turn.rates.matched, turn.rates.offered = match, len(guess)
        if guess:
            turn.rates.note(match, 1, guess[0] == token)

    @staticmethod
    def _count_drafts(turn: Turn, drafted: int, accepted: int) -> None:
        turn.drafted += drafted
        turn.accepted += accepted
        rates = turn.rates
        if rates.drafting != MODEL:
            return  # (lookup's rates learn from each token, _check_lookup)
        # Drafts past the first one refused were never put to the test: each
        # draft is kept with the rate given the ones before it were.
        rates.note(MODEL, accepted + (accepted < drafted), accepted)
        rates.matched, rates.offered = MODEL, drafted
