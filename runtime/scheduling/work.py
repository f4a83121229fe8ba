"""The one small interface between the GPU owner and whatever computes tokens.

Two engines implement it: the real OpenCL engine (`gpu.engine.OpenCLEngine`) and
the timing model the simulator drives (`runtime.scheduling.timing.TimingEngine`).

Who owns what:
- The scheduler owns the KV *block accounting* (which block ids belong to which
  turn). It hands each turn's block table to the engine with every piece of work.
- The engine owns the KV *memory*: a pool of `num_blocks` blocks of `block_size`
  token positions each. It reads and writes only the blocks it is told about, so a
  paused turn is simply absent from the batch and its blocks stay untouched.

One step is a list of `Work` items, at most one per turn: a prefill chunk (several
prompt tokens) or a decode (one token, the turn's last sampled one). The engine
writes K/V for every position it is given and, where `sample` is set, returns the
next token sampled from the logits at the last position of the item. A decode
that verifies drafts (runtime.scheduling.drafts) is the last sampled token and
`drafts` guessed ones: the engine samples at each of its last drafts + 1
positions and returns those tokens as a list, in order.

Sampling is a pure function of (logits, seed, position): a turn paused and resumed
any number of times samples exactly what it samples unpaused.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from runtime.errors import EngineError, UsageError
from runtime.scheduling.constraints import ConstraintChecker, TurnConstraint

if TYPE_CHECKING:
    from runtime.scheduling.cost import StepCost


# An engine (the OpenCL one) enqueues a step in this many groups wherever it may be
# abandoned, and always on a host CPU (gpu/engine.py says why). At each point it
# waits for the launches before the previous point, so one group stays queued and
# the device never idles for the look; a raised flag is seen when the group
# running ends, and the step stops when the group queued behind it does. More
# points stop sooner but wake the enqueuing thread more often, and on a CPU it
# shares the cores, and the GIL, with the device's workers and the event loop.
CHECK_POINTS = 8


class Sampling(msgspec.Struct, frozen=True):
    """How to pick the next token. temperature 0 means greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        # Checked where it is made, so a bad value is the maker's error and never
        # reaches a shared engine step.
        if not _real(self.temperature) or not 0.0 <= self.temperature < math.inf:
            raise UsageError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not _real(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise UsageError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise UsageError(f"seed must be an int, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def _real(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


GREEDY = Sampling()


class Work(msgspec.Struct, gc=False):
    """One turn's share of one engine step. (Never in a reference cycle: nothing
    it holds holds it, so the cycle collector need not track the many a step makes.)"""

    turn: int
    tokens: list[int]  # a prompt chunk, or [last sampled token] for a decode
    start: int  # position of tokens[0] in the turn's sequence
    block_table: list[int]  # the turn's KV blocks, covering start + len(tokens)
    sample: bool  # return a next token for this item
    sampling: Sampling = GREEDY
    # Its turn's constraint, if it has one: the token sampled is one it allows.
    constraint: TurnConstraint | None = None
    # A decode planned while the step before it runs, on the token that step
    # samples for its turn (runtime.scheduling.inflight): its last token is
    # NOT_SAMPLED until whoever runs the steps puts that token there, in a copy
    # (runtime.owner.flight.StepInFlight.hand_over). An engine never sees one set.
    follows: bool = False
    # Its last `drafts` tokens are guesses to verify (runtime.scheduling.drafts):
    # a token is sampled at each of its last drafts + 1 positions, as each
    # would be sampled were the tokens before it the turn's, and the step
    # returns them as a list. Never with a constraint.
    drafts: int = 0
    # Drafts a draft model makes (runtime.owner.drafter): its drafts are
    # TO_DRAFT here; the owner's draft model writes them in the step thread
    # before the step runs, into the copy that runs, and they go back with the
    # step's tokens (StepInFlight.drafted) to be accounted. `context` is the turn's tokens from `context_start` on, its
    # last sampled one included: what the draft model may not have been told.
    context: list[int] | None = None
    context_start: int = 0


def sampled_rows(work: Work) -> int:
    """Rows a step samples for this work: 0, 1, or one per draft and one more."""
    return work.drafts + 1 if work.sample else 0


NOT_SAMPLED = -1  # the last token of a Work that `follows`, until it is known: never a token id
TO_DRAFT = -2  # a draft a draft model writes before the step runs (Work.context): never a token id


class DeadEnd(EngineError):
    """What `Engine.step` raises when some of its turns' constraints allow no next
    token: the step ran for the others. `tokens` is its result (None for the
    dead turns' items), `reasons` why each dead turn cannot go on (its turn.failed
    reason)."""

    def __init__(self, tokens: list[int | None], reasons: dict[int, str]) -> None:
        super().__init__("; ".join(f"turn {turn}: {why}" for turn, why in reasons.items()))
        self.tokens = tokens
        self.reasons = reasons


class TextCodec(Protocol):
    """An engine's tokenizer, as agents use it (gpu.model.tokenizer.Tokenizer is one)."""

    def chat(self, messages: list[dict[str, Any]], *, tools: Sequence[Any] = ()) -> list[int]:
        """The prompt for a chat, its template applied; with tools (runtime.tools.ToolSpec)
        and tool calls in the model's own format."""
        ...

    def stream(self) -> TextStream:
        """A decoder for one turn's tokens, as they come."""
        ...

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str: ...

    def same_vocabulary(self, other: Any) -> bool:
        """Whether every token id means the same text in `other` (a draft model's
        tokens must be its target's: runtime.owner.drafter)."""
        ...


class TextStream(Protocol):
    def push(self, token: int) -> str:
        """The text this token completes (maybe "" mid-character)."""
        ...

    def flush(self) -> str: ...


class Engine(Protocol):
    """Everything the runtime uses of a model engine: nothing is probed for."""

    block_size: int  # token positions per KV block
    num_blocks: int  # blocks in the device pool
    eos_token_ids: frozenset[int]
    tokenizer: TextCodec | None  # None: prompts are token ids (the timing model)
    max_batch_tokens: int | None  # tokens one step can hold; None: no limit
    max_context: int | None  # positions one turn can hold; None: no limit
    vocab_size: int | None  # token ids it knows; None: any
    device_name: str  # for the swarm.started event
    model_name: str | None
    # Whether a step waits on a device. The owner runs a blocking engine's steps
    # in its step thread (runtime.owner.stepthread), off the event loop; one that
    # returns at once (the timing model, not in real time) it calls inline, since
    # a thread would only add two wake-ups to every step.
    blocking: bool
    # Compiles and checks constraints (runtime.scheduling.constraints) for the agents' side
    # before a turn is queued; None: this engine cannot constrain a turn.
    constraints: ConstraintChecker | None
    # What a step costs on this engine (runtime.scheduling.cost): the scheduler's step shaping
    # reads it, the GPU owner feeds it every measured step.
    cost: StepCost

    def calibrate(self) -> None:
        """Time a few deliberately varied steps to seed `cost`. Called once by the
        GPU owner before the first turn; cheap to call again (it does nothing)."""
        ...

    model_id: str  # what K/V depends on besides the tokens; keys the prefix cache

    def step(self, batch: Sequence[Work], abandon: threading.Event | None = None) -> list[int | list[int] | None] | None:
        """Run one forward pass over the batch; one entry per item, a token where
        `sample` was set (a list of drafts + 1 where it verifies drafts), else None. If `blocking`, the owner calls it off the
        event loop.

        `abandon`, if given, may be set from another thread while the step runs:
        the engine may then stop early and return None, having changed nothing that
        counts (K/V it wrote at the batch's positions is written again when the
        batch runs again). The owner gives it for a step a turn that arrives may
        outrank, so that turn does not wait out a long step of lower work."""
        ...

    def swap_out(self, turn: int, blocks: Sequence[int], length: int) -> None:
        """Copy the first `length` positions of a turn's KV to host memory. The
        scheduler frees the device blocks afterwards."""
        ...

    def swap_in(self, turn: int, blocks: Sequence[int]) -> None:
        """Copy a swapped-out turn's KV from host memory into freshly allocated
        device blocks, and forget the host copy."""
        ...

    def forget(self, turn: int) -> None:
        """Drop any host-side state kept for a turn (a swap copy). Idempotent."""
        ...

    def copy(self, source: int, target: int) -> None:
        """Copy one block's K/V (every layer, every position) into another, on the
        device, ordered before the next step. The prefix cache gives a turn the
        rows a cached block shares with its tokens this way (runtime.scheduling.prefix)."""
        ...
