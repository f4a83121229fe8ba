"""The draft model: a second, smaller engine with the target's tokenizer that
writes a verify step's drafts (runtime.scheduling.drafts, `Speculate.DRAFT`).

Why it is a part the owner is given, run in the step thread. The scheduler
decides whether a turn drafts and how many tokens (k), by the step cost law,
as it does for prompt lookup; but the drafts cost k steps of the draft model,
device work that belongs neither in a synchronous scheduler nor on the event
loop. So the plan's verify work carries k placeholders (`work.TO_DRAFT`) and
the turn's tokens the draft model was not told yet (`Work.context`), and
`DeviceWork.run_step` hands it to `fill` right before the verify step, in the
one thread every device call runs in: the draft model's steps are ordered with
the target's like any other. The step runs a copy carrying the drafts, and
the drafts go back with its tokens (`StepInFlight.drafted`), as results.

What it keeps, per turn, on its own engine (its own KV pool, its blocks its
own, never the scheduler's):
- the turn's tokens as told (`history`), and the tokens whose K/V it holds
  (`written`: the history it fed and the drafts it fed after it);
- catching up: at each fill it feeds the told tokens past the longest prefix
  `written` shares with `history`, so a refused draft's K/V is rolled back by
  length (written again at the next fill, never read before);
- its K/V is a cache: short of blocks, the least recently drafting turn's are
  dropped (it catches up again if it drafts again); an ended turn's are freed
  at the next fill, or when the owner is idle (`forget`, then `collect`).

Nothing it does can fail a turn: if the draft model cannot draft (no blocks,
past its context, an engine error), the drafts are the turn's last token
repeated. Any draft is exact to verify; a wrong one is simply not kept.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from runtime.errors import ConfigError
from runtime.scheduling.cost import StepCost, kv_reads
from runtime.scheduling.work import Engine, Work

log = logging.getLogger("runtime.owner.owner")  # the owner's log: this is part of it


@dataclass
class Drafting:
    """One turn's state on the draft model."""

    history: list[int] = field(default_factory=list)  # the turn's tokens as told
    written: list[int] = field(default_factory=list)  # the tokens at positions 0.. of its K/V
    blocks: list[int] = field(default_factory=list)  # its blocks in the draft engine's pool
    last_used: int = 0  # the fill it last drafted in (the least recent is evicted first)


class DraftModel:
    def __init__(self, engine: Engine, target: Engine) -> None:
        check_same_tokens(engine, target)
        self.engine = engine
        self.block_size, self.num_blocks = engine.block_size, engine.num_blocks
        self._free = list(range(engine.num_blocks))
        self._turns: dict[int, Drafting] = {}
        # Touched from the event loop (forget, teach) and the step thread (fill):
        # deques, whose appends and pops are atomic.
        self._ended: collections.deque[int] = collections.deque()
        self._measured: collections.deque[tuple[int, int, float]] = collections.deque()
        self._fills = 0

    @property
    def cost(self) -> StepCost:
        """The draft engine's step cost law: what the scheduler prices a draft at."""
        return self.engine.cost

    @property
    def held_blocks(self) -> int:
        """Blocks of its pool that some turn's K/V holds."""
        return self.num_blocks - len(self._free)

    def calibrate(self) -> None:
        """Off the event loop, at the owner's start: its engine's cost law."""
        self.engine.calibrate()

    def forget(self, turn: int) -> None:
        """A turn ended (any thread): its K/V is freed at the next `collect`."""
        self._ended.append(turn)

    def collect(self) -> None:
        """Free ended turns' K/V. In the step thread, or with nothing running in it."""
        while self._ended:
            self._drop(self._ended.popleft())

    def close(self) -> None:
        """Once the owner has stopped: let go of the engine, so that one the
        swarm opened is freed with its exit (one given to it stays its
        giver's). What it held is still counted (`held_blocks`); nothing
        drafts after, and a use fails as the bug it is."""
        del self.engine

    def teach(self) -> None:
        """On the event loop: what its steps measured goes to its cost law (as
        the owner's own steps do, never while the scheduler reads it)."""
        while self._measured:
            self.engine.cost.observe(*self._measured.popleft())

    def fill(self, works: Sequence[Work], abandon: threading.Event | None = None) -> tuple[list[Work], dict[int, list[int]]]:
        """In the step thread, before the step: the works to run, those that wait
        for drafts (Work.context) as copies carrying them, and the drafts by
        turn. The plan's works are left as planned: the drafts are a result of
        the step, accounted against what it samples (Scheduler.postprocess)."""
        self.collect()
        runnable, drafted = [], {}
        for work in works:
            if work.context is not None and work.drafts:
                drafts = drafted[work.turn] = self._draft(work, abandon)
                work = msgspec.structs.replace(work, tokens=[*work.tokens[: len(work.tokens) - work.drafts], *drafts])
            runnable.append(work)
        return runnable, drafted

    # ------------------------------------------------------------ drafting

    def _draft(self, work: Work, abandon: threading.Event | None) -> list[int]:
        k, last = work.drafts, work.tokens[len(work.tokens) - work.drafts - 1]
        fallback = [last] * k
        assert work.context is not None
        state = self._turns.get(work.turn)
        if state is None:
            state = self._turns[work.turn] = Drafting()
        if len(state.history) < work.context_start:
            log.warning("turn %d: its draft model missed tokens; it drafts from scratch", work.turn)
            self._drop(work.turn)
            return fallback
        history = state.history[: work.context_start] + work.context
        if len(history) != work.start + 1 or history[-1] != last:
            log.warning("turn %d: its draft model's tokens do not match the turn's; it drafts from scratch", work.turn)
            self._drop(work.turn)
            return fallback
        state.history = history
        self._fills += 1
        state.last_used = self._fills
        # Roll back by length: keep the K/V of the longest prefix written that
        # is the turn's (the tokens told never change, so only past what was
        # told before can they differ).
        written = state.written
        keep = min(work.context_start, len(written), len(history))
        while keep < min(len(written), len(history)) and written[keep] == history[keep]:
            keep += 1
        if keep == len(history):
            keep -= 1  # (its last token is fed again, to sample the first draft)
        del written[keep:]
        need = work.start + k  # positions 0 .. start + k - 1: the history and the drafts but the last
        limit = self.engine.max_context
        if (limit is not None and need > limit) or not self._reserve(work.turn, state, need):
            return fallback
        try:
            drafts = self._decode(work, state, keep, abandon)
        except Exception as exc:
            log.warning("turn %d: its draft model failed (%s: %s); no drafts this step", work.turn, type(exc).__name__, exc)
            self._drop(work.turn)
            return fallback
        return drafts if drafts is not None else fallback

    def _decode(self, work: Work, state: Drafting, keep: int, abandon: threading.Event | None) -> list[int] | None:
        """Feed the history past `keep`, then decode k tokens greedily; None if
        abandoned (its verify step will not run)."""
        history, turn, blocks = state.history, work.turn, state.blocks
        chunk = self.engine.max_batch_tokens or len(history)
        start, drafts = keep, []
        while start < len(history):
            end = min(start + chunk, len(history))
            token = self._step(Work(turn, history[start:end], start, blocks, sample=end == len(history)))
            state.written += history[start:end]
            start = end
        drafts.append(token)
        for i in range(1, work.drafts):
            if abandon is not None and abandon.is_set():
                return None
            drafts.append(self._step(Work(turn, [drafts[-1]], len(history) + i - 1, blocks, sample=True)))
            state.written.append(drafts[-2])
        return drafts

    def _step(self, work: Work) -> int:
        began = time.perf_counter()
        out = self.engine.step([work])
        assert out is not None  # (never given an abandon flag)
        self._measured.append((len(work.tokens), kv_reads(work.start, len(work.tokens)), time.perf_counter() - began))
        token = out[0]
        assert isinstance(token, int)
        return token

    # --------------------------------------------------------------- memory

    def _reserve(self, turn: int, state: Drafting, positions: int) -> bool:
        """Blocks for `positions` of the turn's K/V, evicting other turns' least
        recently used; False if the pool cannot hold them at all."""
        blocks_needed = -(-positions // self.block_size) - len(state.blocks)
        if blocks_needed <= 0:
            return True
        if blocks_needed > len(self._free):
            others = sorted((s.last_used, t) for t, s in self._turns.items() if t != turn and s.blocks)
            for _, other in others:
                if blocks_needed <= len(self._free):
                    break
                self._evict(other)
        if blocks_needed > len(self._free):
            return False
        state.blocks += [self._free.pop() for _ in range(blocks_needed)]
        return True

    def _evict(self, turn: int) -> None:
        """Drop a turn's K/V, keeping what it was told (it catches up if it drafts again)."""
        state = self._turns[turn]
        self._free += state.blocks
        state.blocks, state.written = [], []

    def _drop(self, turn: int) -> None:
        state = self._turns.pop(turn, None)
        if state is not None:
            self._free += state.blocks
            self.engine.forget(turn)


def check_same_tokens(draft: Engine, target: Engine) -> None:
    """A draft model must speak the target's tokens: the same vocabulary size and
    end-of-sequence tokens, and where both have a tokenizer, every token the
    same (TextCodec.same_vocabulary)."""
    same = draft.vocab_size == target.vocab_size and draft.eos_token_ids == target.eos_token_ids
    mine, theirs = draft.tokenizer, target.tokenizer
    if same and mine is not None and theirs is not None:
        same = theirs.same_vocabulary(mine)
    if not same:
        raise ConfigError(f"draft model {draft.model_name} does not share {target.model_name}'s tokenizer: it cannot draft for it")
