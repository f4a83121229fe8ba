"""The scheduler's batch: which running turns' work goes into this step.

Every decode first (one token each), then prefill chunks in priority order from
what is left of `step_tokens`. While a turn above background priority is live,
under the preempting policies, the step is shaped for it instead (runtime.scheduling.shaping):
its own work, then the background work that keeps the predicted step within the
slack.

A prompt first takes what the prefix cache has gained since it was admitted
(`_catch_up`), and waits a step rather than compute a block a batch-mate is
computing for the same tokens.

With speculation on (runtime.scheduling.drafts), the turn the step is shaped
for, or a turn running alone, may verify drafts with its decode: as many as the
step cost law says pay. Drafts are looked up from the turn's tokens, its last
one included, so such a turn is planned only once nothing is in flight for it
(the plan says `settle`: the owner lands it before planning the next step).
With a draft model, the plan holds placeholders its draft model fills in the
step thread (runtime.scheduling.drafts says why), and the law counts the draft
model's steps (`draft_cost`, its engine's law).

`Batching` is a part the scheduler owns, with no state of its own between
steps: it reads the running turns through the scheduler it is given, and
grows their K/V through the scheduler's `KVMemory`. Nothing here admits or
pauses a turn, except through `KVMemory.reserve` when memory runs short.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from runtime.errors import ConfigError
from runtime.scheduling.cost import StepCost, kv_reads, step_features
from runtime.scheduling.drafts import MODEL, DraftCost, Lookup, Speculate, drafts_that_pay
from runtime.scheduling.inflight import SETTLED, Ahead, InFlight
from runtime.scheduling.kvmoves import KVMemory
from runtime.scheduling.prefix import PrefixCache
from runtime.scheduling.priority import Priorities
from runtime.scheduling.shaping import StepBudget, protected_priority
from runtime.scheduling.turns import Plan, SchedulerConfig, Status, Turn
from runtime.scheduling.work import NOT_SAMPLED, TO_DRAFT, Work

NO_DRAFTS: list[int] = []  # (never changed)


class Running(Protocol):
    """What the batch asks of the scheduler: the turns in a slot (by slot, and
    in priority order, with their keys), the highest unaged priority among the
    live turns, and the step being planned."""

    @property
    def running(self) -> dict[int, Turn]: ...

    def ranked(self, now: float) -> list[Turn]: ...

    def ranks(self, now: float) -> list[tuple[int, int, Turn]]: ...

    def top_unaged(self) -> int | None: ...

    step: int


class Batching:
    def __init__(
        self,
        config: SchedulerConfig,
        cost: StepCost,
        prefix: PrefixCache,
        in_flight: InFlight,
        priorities: Priorities,
        memory: KVMemory,
        seats: Running,
        draft_cost: StepCost | None = None,
    ) -> None:
        if config.speculate is Speculate.DRAFT and draft_cost is None:
            raise ConfigError("speculate=draft needs a draft model (and its step cost law); this engine has none")
        self.config = config
        self.draft_cost = draft_cost if config.speculate is Speculate.DRAFT else None  # a draft model's, if it drafts
        self.policy = config.policy
        self.shapes = config.shaping and config.policy.preempts  # (asked every step)
        self.cost = cost
        self.block_size = memory.pool.block_size
        self.prefix = prefix
        self.in_flight = in_flight  # the turns are planned as they stand once it lands
        self.priorities = priorities
        self.memory = memory
        self.seats = seats
        self.speculates = config.speculate is not Speculate.OFF
        self._step = 0

    def fill(self, now: float, plan: Plan) -> None:
        """Pick this step's work: every decode first (one token each), then prefill
        chunks in priority order from what is left of the token budget. While a
        turn above background priority is live, the step is shaped for it instead.
        Each turn is taken as it stands once the steps in flight land."""
        self._step = self.seats.step  # (the step being planned, noted on each turn taken)
        protected = self._protected_priority()
        if protected is not None and self._batch_shaped(protected, now, plan):
            return
        budget = self.config.step_tokens
        ranked = self.seats.ranked(now)
        alone = self.speculates and len(ranked) == 1  # (a turn alone may speculate)
        for turn, ahead, pending in self._batch_order(ranked):
            if budget <= 0:
                break
            if pending == 1:  # a decode: nothing to catch up on (_catch_up's first test)
                budget -= self._take(turn, 1, now, plan, ahead, alone and budget > 1)
            elif self._catch_up(turn, plan, ahead):  # (which may shorten what it has to feed)
                budget -= self._take(turn, min(ahead.pending(turn), budget), now, plan, ahead)

    def _batch_shaped(self, at: int, now: float, plan: Plan) -> bool:
        """runtime.scheduling.shaping: the protected turns' work, then the background work that
        fits the cost budget. False (nothing added) if no protected work can run."""
        # (one pass over the running turns sorts them into protected and background,
        # each turn's unaged priority asked once; with each background turn's
        # ranking key: minus its effective priority, and when it was admitted)
        unaged = self.priorities.unaged if self.priorities.lent else None  # (nothing lent: a turn's own priority, not asked)
        protected, background = [], []
        for key in self.seats.ranks(now):
            turn = key[2]
            if (unaged(turn) if unaged else turn.priority) >= at:
                protected.append(turn)
            else:
                background.append(key)
        budget = StepBudget(self.cost, self.config.slack)
        chunk = max(self.config.prefill_chunk, self.config.step_tokens)
        preemptions = plan.preemptions
        for turn, ahead, pending in self._batch_order(protected):
            if pending == 1:  # a decode: nothing to catch up on (_catch_up's first test)
                n = self._take(turn, 1, now, plan, ahead, self.speculates) if chunk > 0 else 0
            elif chunk > 0 and self._catch_up(turn, plan, ahead):
                n = self._take(turn, min(ahead.pending(turn), chunk), now, plan, ahead, self.speculates)
            else:
                n = 0
            if n:
                budget.add(plan.works[-1].start, n)
                chunk -= n if n > 1 else 0
        if not plan.works:
            return False  # e.g. waiting for memory that only background progress frees
        budget.close_base()
        if plan.preemptions != preemptions:  # (a turn paused for the protected work's memory has none)
            background = [key for key in background if key[2].status is Status.RUNNING]
        # Background work in what the slack leaves: decodes first (they keep running
        # turns moving), then prefill chunks cut to fit; longest-unserved first.
        # (each turn's share of the steps in flight is looked up once: taking
        # another turn's work, or catching up on the cache, does not change it)
        of = self.in_flight.of if self.in_flight.launched else None
        others = []
        for neg_effective, last_admit, turn in background:
            ahead = of(turn) if of else SETTLED  # (nothing in flight: the simulator's every step)
            # (Ahead.pending, inlined: decodes first)
            feed = len(turn.prompt) + len(turn.output) + ahead.tokens - turn.computed - ahead.positions
            others.append((feed > 1, neg_effective, turn.last_stepped, last_admit, turn, ahead, feed))
        others.sort()  # (by the four keys: last_admit is every running turn's own)
        room = self.config.step_tokens
        take, largest, add = self._take, budget.largest, budget.add
        for _, _, _, _, turn, ahead, feed in others:
            if feed > 1:  # (a decode has nothing to catch up on: _catch_up's first test)
                if not self._catch_up(turn, plan, ahead):
                    continue
                feed = ahead.pending(turn)  # (the catch-up may have shortened what it has to feed)
            start = turn.computed + ahead.positions
            n = largest(start, min(feed, room))
            if n and take(turn, n, now, plan, ahead):
                add(start, n)
                room -= n if feed > 1 else 0
        return True

    def _batch_order(self, ranked: Iterable[Turn]) -> list[tuple[Turn, Ahead, int]]:
        """The turns, given in priority order (Scheduler.ranked), in the order
        their work is taken, each with its share of the steps in flight and what
        it has to feed before its next sample (InFlight.pending): decodes first,
        then the rest, each in the order given."""
        of = self.in_flight.of if self.in_flight.launched else None  # (this runs for every turn at every step)
        decodes, rest = [], []
        for turn in ranked:
            ahead = of(turn) if of else SETTLED  # (nothing in flight: the simulator's every step)
            pending = len(turn.prompt) + len(turn.output) + ahead.tokens - turn.computed - ahead.positions  # (Ahead.pending, inlined)
            (rest if pending > 1 else decodes).append((turn, ahead, pending))
        return decodes + rest if rest else decodes

    def _catch_up(self, turn: Turn, plan: Plan, ahead: Ahead) -> bool:
        """Before a prompt's next chunk is planned: take what the prefix cache has
        gained since (runtime.scheduling.prefix). False if the turn should wait this step,
        because a batch-mate computes its next block for the same tokens. (`ahead`:
        its share of the steps in flight, which the caller has.)"""
        if turn.status is not Status.RUNNING or ahead.pending(turn) <= 1 or not self.prefix.enabled:
            return True
        self.prefix.extend(turn)
        if self._computed_alongside(turn, plan):
            plan.held.append(turn)
            return False
        self.prefix.copy_rows(turn, plan.moves)
        return True

    def _computed_alongside(self, turn: Turn, plan: Plan) -> bool:
        """Whether a turn already in this step, or in a step in flight, computes
        the full block the turn would compute next, for the same tokens: then it is registered after the
        step and the turn takes it by reference (turns that arrive together with
        one system prompt compute it once)."""
        size = self.block_size
        i, rest = divmod(self.in_flight.computed(turn), size)
        # A prefilling turn's keys count as named up to its reusable blocks (where
        # `PrefixCache.extend` named them at its admission: its length has not
        # changed since), but are made only here, once a batch-mate's block is
        # there to compare with: most prompts share none.
        if rest or i >= max(len(turn.hashes), turn.reusable_blocks(size)):
            return False
        key = None
        # (the steps in flight too: what they compute is only shared once they land)
        works, turns = plan.works, plan.turns
        if self.in_flight.launched:
            for launched in self.in_flight.plans:
                works, turns = works + launched.works, turns + launched.turns
        first, last = i * size, (i + 1) * size  # the block's positions
        for work, other in zip(works, turns, strict=False):
            start = work.start  # (nearly every work is a decode past its prompt: the first test)
            if start >= len(other.prompt) or start >= last or start + len(work.tokens) <= first:
                continue
            if len(other.hashes) <= i:
                if (i + 1) * size > len(other.prompt):
                    continue  # (its tokens past the prompt are not all known yet)
                # Not named yet: the step in flight computes it, and only then is it committed.
                self.prefix.chain(other, i + 1)
            if key is None:
                key = self.prefix.chain(turn, i + 1)[i]
            if other.hashes[i] == key:
                return True
        return False

    def _take(self, turn: Turn, n: int, now: float, plan: Plan, ahead: Ahead, speculate: bool = False) -> int:
        """Add `n` tokens of a running turn's work to the plan, growing its KV;
        the tokens added (0: none, it could not run this step). `ahead`: its
        share of the steps in flight. A decode that may `speculate` adds the
        drafts that pay (runtime.scheduling.drafts)."""
        if turn.status is not Status.RUNNING:
            return 0  # preempted for memory while this batch was built
        prompt, output, blocks = turn.prompt, turn.output, turn.blocks
        known = len(prompt) + len(output)  # its tokens so far (Turn.length, inlined: once a step per turn)
        if ahead.tokens:
            if ahead.verifying:
                return 0  # its next position is not known yet
            # Its last token may be the one being sampled, by length or context: it
            # ends when that step lands.
            max_context = self.config.max_context
            if len(output) + ahead.tokens >= turn.max_tokens or (max_context and known + ahead.tokens >= max_context):
                return 0
        start = turn.computed + ahead.positions
        end = start + n
        if len(blocks) * self.block_size < end and not self.memory.reserve(blocks, end, now, plan, keep=turn):
            return 0  # it was paused to free memory
        # (all it has to feed before its next sample: a decode, or its prompt's last chunk)
        sample = end == known + ahead.tokens
        if end > known:  # its input is the token a step in flight samples: whoever runs the steps puts it there
            tokens, follows = [*turn.tokens(start, end - 1), NOT_SAMPLED] if n > 1 else [NOT_SAMPLED], True
        elif n == 1:  # (Turn.token_at, inlined: a decode's one token, nearly every work)
            tokens, follows = [prompt[start] if start < len(prompt) else output[start - len(prompt)]], False
        else:
            tokens, follows = turn.tokens(start, end), False
        if speculate and sample and turn.constraint is None:
            return self._take_with_drafts(turn, n, plan, ahead, start, known, tokens, follows)
        # (a copy of the block table: the turn's own changes while a step runs, see Scheduler.advance)
        plan.works.append(Work(turn.id, tokens, start, blocks[:], sample, turn.sampling, turn.constraint, follows))
        plan.turns.append(turn)
        turn.last_stepped = self._step
        return n

    def _take_with_drafts(
        self, turn: Turn, n: int, plan: Plan, ahead: Ahead, start: int, known: int, tokens: list[int], follows: bool
    ) -> int:
        """The rest of `_take` for a work that samples and may speculate: its
        `tokens`, then the drafts that pay (none, unless it is settled)."""
        drafts = self._guess(turn, start, n, plan, ahead)
        work = Work(turn.id, tokens + drafts, start, turn.blocks[:], True, turn.sampling, turn.constraint, follows, len(drafts))
        if drafts and self.draft_cost is not None:  # (drafts the draft model writes: what it was not told yet)
            work.context, work.context_start = turn.tokens(turn.draft_told, known), turn.draft_told
        plan.works.append(work)
        plan.turns.append(turn)
        turn.last_stepped = self._step
        return n + len(drafts)

    def _guess(self, turn: Turn, start: int, n: int, plan: Plan, ahead: Ahead) -> list[int]:
        """The drafts a decode that may speculate verifies with its token (none
        unless it is settled, runtime.scheduling.drafts); and the plan says
        `settle` where drafts may pay next step: they follow the token it samples,
        so the next step is planned once this one has landed (losing the overlap
        for it)."""
        if self.draft_cost is not None:
            drafts = self._model_drafts(turn, start, plan) if ahead is SETTLED and n == 1 else NO_DRAFTS
            if drafts:
                plan.settle = True
            else:  # (land this step first where the next may draft)
                tokens_so_far, kv = step_features(plan.works)
                plan.settle |= self._model_drafts_pay(turn, self.config.max_drafts, tokens_so_far, kv, start + n) > 0
            return drafts
        if turn.lookup is None:  # (from now on, accounting checks its tokens against lookup: runtime.scheduling.drafts.Rate)
            turn.lookup = Lookup()
        drafts = self._drafts(turn, start, plan) if ahead is SETTLED and n == 1 else NO_DRAFTS
        rates = turn.rates
        match, offered = (rates.drafting, len(drafts)) if drafts else (rates.matched, rates.offered)
        if match:
            tokens_so_far, kv = step_features(plan.works)
            most = min(offered, self.config.max_drafts)
            plan.settle |= drafts_that_pay(self.cost, rates.chain(match, most), most, tokens_so_far, kv, start + n) > 0
        return drafts

    def _most_drafts(self, turn: Turn, tokens: int) -> int:
        """The most drafts a decode may verify beside `tokens` other tokens: within
        the turn's max_tokens, its context and the step's tokens."""
        most = min(self.config.max_drafts, turn.max_tokens - len(turn.output) - 1, self.config.step_tokens - tokens - 1)
        if self.config.max_context:
            most = min(most, self.config.max_context - turn.length)
        return most

    def _model_drafts_pay(self, turn: Turn, most: int, tokens: int, kv: int, start: int) -> int:
        """`drafts_that_pay` for the draft model: its rate, and what its steps
        cost by its own law: reading what it was not told (the whole context,
        the first time: a share of it per step), then a step a draft."""
        law = self.draft_cost
        assert law is not None
        told, known = turn.draft_told, turn.length
        behind = max(1, known - told)  # (its tokens the draft model reads before drafting, the last included)
        once_s = law.predict(behind - 1, kv_reads(0, behind - 1)) if told == 0 else 0.0
        catch_up = 1 if told == 0 else behind
        draft = DraftCost(
            step_s=law.predict(1, start),
            catch_up_s=law.predict(catch_up, kv_reads(known - catch_up, catch_up)),
            once_s=once_s,
            remaining=turn.max_tokens - len(turn.output),
        )
        return drafts_that_pay(self.cost, turn.rates.chain(MODEL, most), most, tokens, kv, start, draft)

    def _model_drafts(self, turn: Turn, start: int, plan: Plan) -> list[int]:
        """A settled decode's drafts from the draft model: as many placeholders
        as pay (the draft model writes them, runtime.owner.drafter), within
        `_most_drafts` and the free blocks."""
        tokens, kv = step_features(plan.works)
        most = self._most_drafts(turn, tokens)
        k = self._model_drafts_pay(turn, most, tokens, kv, start) if most > 0 else 0
        if k and not self.memory.pool.grow(turn.blocks, start + 1 + k):
            k = 0
        turn.rates.drafting = MODEL if k else 0
        return [TO_DRAFT] * k

    def _drafts(self, turn: Turn, start: int, plan: Plan) -> list[int]:
        """The drafts a settled decode at `start` verifies: those prompt lookup
        proposes, as many as pay by the step cost law, within `_most_drafts`
        and the free blocks (a draft never evicts anyone's K/V)."""
        known = turn.length
        lookup = turn.lookup
        assert lookup is not None
        lookup.extend(turn.tokens(lookup.fed, known))
        tokens, kv = step_features(plan.works)
        most = self._most_drafts(turn, tokens)
        proposed, match = lookup.proposal(most) if most > 0 else ([], 0)
        k = drafts_that_pay(self.cost, turn.rates.chain(match, len(proposed)), len(proposed), tokens, kv, start) if proposed else 0
        if k and not self.memory.pool.grow(turn.blocks, start + 1 + k):
            k = 0
        turn.rates.drafting = match if k else 0
        return proposed[:k]

    def _protected_priority(self) -> int | None:
        if not self.shapes:
            return None
        return protected_priority(self.seats.top_unaged())
