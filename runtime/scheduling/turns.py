"""The scheduler's vocabulary: policies, its settings, a turn as it sees one, a plan."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from runtime.errors import ConfigError
from runtime.events.kinds import Ended, Event
from runtime.scheduling.constraints import TurnConstraint
from runtime.scheduling.cost import step_features
from runtime.scheduling.drafts import MAX_DRAFTS, Lookup, Rates, Speculate
from runtime.scheduling.priority import FOREGROUND
from runtime.scheduling.units import ceil_div
from runtime.scheduling.work import GREEDY, Engine, Sampling, Work


class Policy(enum.StrEnum):
    FCFS = "fcfs"  # no priority at all
    PRIORITY = "priority"  # priority orders the queue, never preempts (vLLM once full)
    RECOMPUTE = "recompute"  # preempts; the victim's KV is dropped and re-prefilled (SGLang)
    SWAP = "swap"  # preempts; the victim's KV goes to host memory and back
    RESIDENT = "resident"  # preempts; the victim's KV stays on the device

    @property
    def preempts(self) -> bool:
        return self in (Policy.RECOMPUTE, Policy.SWAP, Policy.RESIDENT)

    @classmethod
    def parse(cls, name: str) -> Policy:
        try:
            return cls(name)
        except ValueError:
            raise ConfigError(f"unknown policy {name!r}; {cls._choices()}") from None

    @classmethod
    def _choices(cls) -> str:
        return f"choose from {', '.join(p.value for p in cls)}"

    @classmethod
    def parse_list(cls, text: str, *, variants: tuple[str, ...] = ()) -> list[str]:
        """A comma-separated list of policies, each NAME or NAME:VARIANT (one of
        `variants`), checked and normalised: what --policies flags take."""
        names = [p.strip() for p in text.split(",") if p.strip()]
        if not names:
            raise ConfigError(f"--policies names no policy; {cls._choices()}")
        out = []
        for name in names:
            policy, _, variant = name.partition(":")
            if variant and variant not in variants:
                allowed = " or ".join(f"NAME:{v}" for v in variants) or "none"
                raise ConfigError(f"--policies: {name!r}: a variant is written {allowed}")
            out.append(cls.parse(policy).value + (f":{variant}" if variant else ""))
        return out


@dataclass
class SchedulerConfig:
    slots: int = 8
    policy: Policy = Policy.RESIDENT
    # Tokens one step may process (decodes + prefill chunks): bounds every step's
    # length, and so every foreground wait, however long a prompt is.
    step_tokens: int = 128
    # Anti-starvation: a waiting turn gains one priority level per `aging_s` seconds
    # waited, up to `aging_cap`. The cap sits below FOREGROUND, so aging reorders and
    # preempts background work but never the foreground.
    aging_s: float = 10.0
    aging_cap: int = FOREGROUND - 1
    # Host memory for swapped-out KV, in blocks; None = unbounded. When it is full,
    # memory pressure drops KV (recompute on resume) instead.
    swap_blocks: int | None = None
    # Share full KV blocks between turns whose tokens start alike (runtime.scheduling.prefix).
    prefix_cache: bool = True
    max_context: int | None = None
    # Step shaping (runtime.scheduling.shaping), under the preempting policies: while a turn
    # above background priority is live, background decodes join its step only
    # while the predicted step stays within (1 + slack) of the step without them,
    # and background prefill waits. The protected turn's prompt goes in chunks of
    # up to `prefill_chunk` tokens.
    shaping: bool = True
    slack: float = 0.25
    prefill_chunk: int = 512
    # Under the preempting policies, a turn that arrives above every turn in the
    # step in flight has that step abandoned rather than wait it out (runtime.owner.abandon).
    abandon_steps: bool = True
    # Speculative decoding (runtime.scheduling.drafts): the turn a step is built
    # for, or one running alone, verifies up to `max_drafts` guessed tokens a
    # step where the step cost law says they pay.
    speculate: Speculate = Speculate.OFF
    max_drafts: int = MAX_DRAFTS

    def __post_init__(self) -> None:
        self.policy = Policy.parse(self.policy) if isinstance(self.policy, str) else self.policy
        if not isinstance(self.policy, Policy):
            raise ConfigError(f"policy must be one of {', '.join(p.value for p in Policy)}, got {self.policy!r}")
        self.speculate = Speculate.parse(self.speculate)
        for name in ("slots", "step_tokens", "prefill_chunk", "max_drafts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{name} must be an int, got {value!r}")
        for name in ("aging_s", "slack"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"{name} must be a finite number, got {value!r}")
        if self.swap_blocks is not None and (
            isinstance(self.swap_blocks, bool) or not isinstance(self.swap_blocks, int) or self.swap_blocks < 0
        ):
            raise ConfigError(f"swap_blocks must be None or an int >= 0, got {self.swap_blocks!r}")
        if self.slots < 1:
            raise ConfigError(f"slots must be at least 1, got {self.slots}")
        if self.step_tokens < self.slots:
            raise ConfigError(
                f"step_tokens ({self.step_tokens}) must be at least slots ({self.slots}), so every running turn can decode each step"
            )
        if self.aging_s <= 0:
            raise ConfigError(f"aging_s must be positive, got {self.aging_s}")
        if self.slack < 0:
            raise ConfigError(f"slack must be at least 0, got {self.slack}")
        if self.prefill_chunk < 1:
            raise ConfigError(f"prefill_chunk must be at least 1, got {self.prefill_chunk}")
        if self.max_drafts < 0:
            raise ConfigError(f"max_drafts must be at least 0, got {self.max_drafts}")


class Status(enum.Enum):
    """Where a turn is, and so where its K/V is: a turn is in exactly one."""

    QUEUED = "queued"  # waiting for its first slot
    RUNNING = "running"  # in a slot; its K/V on the device
    PAUSED = "paused"  # preempted; its K/V stays on the device (possibly empty)
    SWAPPED = "swapped"  # preempted; its K/V in host memory
    DROPPED = "dropped"  # preempted; its K/V gone, re-prefilled when it resumes
    ENDED = "ended"  # it has its terminal event

    @property
    def waiting(self) -> bool:
        """In the queue for a slot (first, or again)."""
        return self in (Status.QUEUED, Status.PAUSED, Status.SWAPPED, Status.DROPPED)

    @property
    def resident(self) -> bool:
        """Whatever K/V it has is on the device."""
        return self in (Status.QUEUED, Status.RUNNING, Status.PAUSED)


@dataclass(eq=False, slots=True)
class Turn:
    id: int
    agent: str
    priority: int  # base priority
    prompt: list[int]
    max_tokens: int
    sampling: Sampling = GREEDY
    ignore_eos: bool = False
    arrived: float = 0.0
    constraint: TurnConstraint | None = None  # what its output must be (runtime.scheduling.constraints)
    lifts: tuple[str, ...] = ()  # names a priority may be lent under: its agent, the requests it serves
    # Settled facts only: what steps in flight will add is runtime.scheduling.inflight's.
    output: list[int] = field(default_factory=list)  # the tokens sampled so far
    computed: int = 0  # positions whose K/V is in the cache (landed)
    blocks: list[int] = field(default_factory=list)
    status: Status = Status.QUEUED
    swapped_len: int = 0
    swap_kept: list[int] = field(default_factory=list)  # block indices a swap-out left on the device (shared)
    hashes: list[bytes] = field(default_factory=list)  # chain hashes of its full blocks (runtime.scheduling.prefix)
    committed: int = 0  # leading blocks registered in the prefix cache
    cached_tokens: int = 0  # positions reused from the prefix cache at the last (re)admission
    cache_hits: int = 0  # positions reused from the prefix cache over its life (what turn.ended says)
    prefilled: int = 0  # positions the engine computed for it other than decodes: its prompt, recomputes
    slot: int | None = None  # the slot it holds while RUNNING
    enqueued: int = 0  # its place in the queue: order of (re)joining it
    admitted_at: float | None = None  # first admission: the end of the wait
    last_admit: int = 0  # admission order; the latest admitted is preempted first
    last_stepped: int = 0  # the step it last had work in (shaping serves the longest-unserved first)
    aging_kept: int = 0  # aging levels earned by waiting, kept while it runs (runtime.scheduling.priority)
    waiting_since: float = 0.0  # since it (re)joined the queue: aging, and how long a pause was
    first_token_at: float | None = None  # when its first output token was sampled
    token_times: list[float] = field(default_factory=list)  # when each output token was sampled
    paused_s: float = 0.0
    preemptions: int = 0
    told_tokens: int = 0  # its tokens so far as last told in turn.progress (runtime.scheduling.scheduler)
    # Speculative decoding (runtime.scheduling.drafts): its n-grams, made at its
    # first chance to; the share of its drafts kept; and its counts so far.
    lookup: Lookup | None = None
    rates: Rates = field(default_factory=Rates)
    draft_told: int = 0  # its tokens a draft model was told, as of the steps landed (Work.context)
    drafted: int = 0  # draft tokens its steps verified
    accepted: int = 0  # of them, kept
    sampling_steps: int = 0  # steps that sampled for it (a verify step once, whatever it kept)
    ended: Ended | None = None  # its terminal event, once it has one

    @property
    def done(self) -> bool:
        return self.status is Status.ENDED

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.output)

    def token_at(self, position: int) -> int:
        n = len(self.prompt)
        return self.prompt[position] if position < n else self.output[position - n]

    def tokens(self, start: int, stop: int) -> list[int]:
        n = len(self.prompt)
        if stop <= n:
            return self.prompt[start:stop]
        if start >= n:
            return self.output[start - n : stop - n]
        return self.prompt[start:] + self.output[: stop - n]

    # Block arithmetic, in blocks of `size` positions: what the turn needs and holds.

    def blocks_needed(self, size: int, max_context: int | None = None) -> int:
        """Blocks to run to its end: the prompt and every token it may add, within
        the context."""
        most = self.length + self.max_tokens
        return ceil_div(min(most, max_context or most), size)

    def covers(self, positions: int, size: int) -> bool:
        """Whether its block table holds `positions` positions already."""
        return len(self.blocks) * size >= positions

    def blocks_missing(self, positions: int, size: int) -> int:
        """Blocks its table lacks to cover `positions` (0 when it covers them)."""
        return max(0, ceil_div(positions, size) - len(self.blocks))

    def full_blocks(self, size: int) -> int:
        """Leading blocks it holds whose every position is computed (cacheable)."""
        return min(self.computed // size, len(self.blocks))

    def reusable_blocks(self, size: int) -> int:
        """Leading full blocks another turn's K/V may stand for: all but the block
        of its last token, which it computes itself to sample."""
        return (self.length - 1) // size

    def host_blocks(self, size: int) -> int:
        """Blocks of its swapped-out K/V that live in host memory (not the shared
        ones a swap-out left on the device)."""
        return ceil_div(self.swapped_len, size) - len(self.swap_kept)


@dataclass(frozen=True)
class SwapOut:
    """Copy the first `length` positions of a turn's KV from `blocks` to host memory."""

    turn: int
    blocks: list[int]
    length: int

    def apply(self, engine: Engine) -> None:
        engine.swap_out(self.turn, self.blocks, self.length)


@dataclass(frozen=True)
class SwapIn:
    """Copy a turn's host copy into `blocks`, and forget the host copy."""

    turn: int
    blocks: list[int]

    def apply(self, engine: Engine) -> None:
        engine.swap_in(self.turn, self.blocks)


@dataclass(frozen=True)
class Forget:
    """Drop a turn's host copy: it is void (a block its swap-out left on the device,
    shared, has been evicted since), and the turn is recomputed instead."""

    turn: int

    def apply(self, engine: Engine) -> None:
        engine.forget(self.turn)


@dataclass(frozen=True)
class Copy:
    """Copy block `source`'s K/V into block `target` (a turn's own, fresh): the
    rows a cached block shares with the turn's tokens (runtime.scheduling.prefix). The rows
    past them are stale and are written before anything reads them."""

    turn: int  # the turn the target belongs to
    source: int
    target: int

    def apply(self, engine: Engine) -> None:
        engine.copy(self.source, self.target)


@dataclass(slots=True)
class Plan:
    """One step's decisions: KV moves to make first, in order, then the batch to run.

    The moves must run in the order they were decided: one plan can swap a turn in
    and then evict it again (its KV goes back out from the blocks it just got), or
    evict a turn and hand its blocks to another's swap-in."""

    works: list[Work] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    moves: list[SwapOut | SwapIn | Forget | Copy] = field(default_factory=list)
    preemptions: int = 0
    held: list[Turn] = field(default_factory=list)  # prompts waiting a step for a batch-mate's blocks
    # A turn in it may speculate next step: plan the next once this one has landed
    # (its drafts are looked up from its tokens, the last one included).
    settle: bool = False
    # What its KV moves do (kv.swapped_out, kv.swapped_in), told only once they
    # are made: a move may fail (Scheduler.settle_moves).
    moved: list[Event] = field(default_factory=list)
    _features: tuple[int, int] | None = field(default=None, init=False, repr=False)

    @property
    def features(self) -> tuple[int, int]:
        """(tokens, kv_reads) of its step, runtime.scheduling.cost's features, asked once the
        batch is built: the owner asks twice a step (runtime.owner.abandon, and the
        cost law when the step is measured)."""
        if self._features is None:
            self._features = step_features(self.works)
        return self._features

    @property
    def swap_out(self) -> list[tuple[int, list[int], int]]:
        return [(m.turn, m.blocks, m.length) for m in self.moves if isinstance(m, SwapOut)]

    @property
    def swap_in(self) -> list[tuple[int, list[int]]]:
        return [(m.turn, m.blocks) for m in self.moves if isinstance(m, SwapIn)]

    @property
    def copies(self) -> list[Copy]:
        return [m for m in self.moves if isinstance(m, Copy)]

    @property
    def prefill_tokens(self) -> int:
        return sum(len(w.tokens) for w in self.works if len(w.tokens) > 1)
