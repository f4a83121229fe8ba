"""`swarm sim`: a discrete-event simulation of the GPU owner on a virtual clock.

It drives the real `runtime.scheduling.scheduler.Scheduler` with the timing-model engine, so
the policy measured here is the policy that ships. Background agents run closed
loops (a new turn the moment the last one ends) and keep every slot busy; the
foreground agent's turns arrive at random. Between events (an arrival, a turn
ending, an aging tick) every step is the same decode step, so the simulator
stretches one plan over many steps and skips ahead (Scheduler.repeatable).
"""

from __future__ import annotations

import functools
import math
import tomllib
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import numpy as np

from runtime.errors import ConfigError
from runtime.events.kinds import Admitted, Ended, Event, Preempted, Queued, Recomputed
from runtime.owner.abandon import abandon_bar, stopped_after
from runtime.scheduling.blocks import BlockPool
from runtime.scheduling.priority import BACKGROUND, FOREGROUND
from runtime.scheduling.scheduler import Scheduler
from runtime.scheduling.timing import TimingEngine, TimingModel
from runtime.scheduling.turns import Plan, Policy, SchedulerConfig, Turn
from runtime.scheduling.units import ceil_div, percentiles

POLICIES = [p.value for p in Policy]


def _check(struct: msgspec.Struct, *, positive=(), non_negative=(), at_least_1=()) -> None:
    for names, ok, what in (
        (positive, lambda v: v > 0, "> 0"),
        (non_negative, lambda v: v >= 0, ">= 0"),
        (at_least_1, lambda v: v >= 1, ">= 1"),
    ):
        for name in names:
            value = getattr(struct, name)
            if not ok(value):  # NaN fails every comparison
                raise ValueError(f"{name} must be {what}, got {value!r}")


class Lengths(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A clipped heavy-tailed distribution of turn lengths in tokens."""

    dist: str = "lognormal"  # or "pareto"
    mean: float = 354.0
    sigma: float = 1.2  # lognormal shape
    alpha: float = 1.5  # pareto shape (smaller: heavier tail)
    min: int = 1
    max: int = 4096

    def __post_init__(self) -> None:
        # Raised as ValueError so msgspec.convert reports it with the field's path.
        _check(self, positive=("mean", "sigma", "alpha"), at_least_1=("min",))
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) must be at least min ({self.min})")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.dist == "lognormal":
            mu = math.log(self.mean) - self.sigma**2 / 2
            raw = rng.lognormal(mu, self.sigma, n)
        elif self.dist == "pareto":
            if self.alpha <= 1:
                raise ConfigError(f"pareto alpha must exceed 1 for a finite mean, got {self.alpha}")
            scale = self.mean * (self.alpha - 1) / self.alpha
            raw = scale * (1 + rng.pareto(self.alpha, n))
        else:
            raise ConfigError(f"unknown length distribution {self.dist!r}; use lognormal or pareto")
        return np.clip(np.rint(raw), self.min, self.max).astype(np.int64)


class Workload(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The seed workload by default: 8 slots at 39 tok/s each, background turns
    averaging 354 tokens with a long tail, foreground turns at random."""

    slots: int = 8
    background_agents: int = 8
    background: Lengths = Lengths()
    background_prompt: int = 64
    foreground: Lengths = Lengths(mean=128.0, sigma=0.8, max=1024)
    foreground_prompt: int = 64
    foreground_interval_s: float = 10.0  # mean of exponential gaps
    # The share of every prompt that repeats the agent's earlier prompts (its system
    # prompt, its conversation): what the prefix cache can hit. The rest is new.
    prefix_share: float = 0.0
    prefix_cache: bool = True
    arrivals: int = 2000
    warmup_s: float = 60.0  # let the background reach its steady mix first
    step_tokens: int = 128
    block_size: int = 16
    aging_s: float = 10.0
    timing: TimingModel = TimingModel()
    shaping: bool = True  # step shaping for the foreground (runtime.scheduling.shaping)
    slack: float = 0.25
    abandon_steps: bool = True  # a foreground arrival stops the step in flight (runtime.owner.abandon)
    seed: int = 0

    def __post_init__(self) -> None:
        _check(
            self,
            positive=("foreground_interval_s", "aging_s"),
            non_negative=("warmup_s", "slack", "background_agents"),
            at_least_1=("slots", "arrivals", "background_prompt", "foreground_prompt", "step_tokens", "block_size"),
        )

    @property
    def num_blocks(self) -> int:
        # Room for every slot's longest turn plus the paused ones: the seed
        # workload is about time, not memory.
        longest = self.background_prompt + self.background.max + self.foreground_prompt + self.foreground.max
        return 2 * (self.slots + 2) * ceil_div(longest, self.block_size)


def load_workload(path: str | Path | None, **overrides) -> Workload:
    data: dict = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"workload file {path}: {exc}") from None
    for key, value in overrides.items():
        if value is None:
            continue
        section, _, name = key.rpartition(".")
        target = data.setdefault(section, {}) if section else data
        target[name] = value
    try:
        return msgspec.convert(data, Workload)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"workload{' file ' + str(path) if path else ''}: {exc}") from None


@dataclass
class Result:
    policy: str
    fg_waits: list[float] = field(default_factory=list)
    fg_ttft: list[float] = field(default_factory=list)  # request to first token
    fg_itl: list[float] = field(default_factory=list)  # between consecutive tokens
    fg_turn: list[float] = field(default_factory=list)  # request to last token
    bg_tokens: int = 0
    preemptions: int = 0
    recomputed_tokens: int = 0  # what resuming cost under recompute
    prompt_tokens: int = 0  # prompt tokens of admitted turns
    cached_tokens: int = 0  # of those, found in the prefix cache
    swapped_bytes: int = 0  # and under swap (both directions)
    abandoned_steps: int = 0  # stopped early for a foreground arrival
    span_s: float = 0.0
    steps: int = 0

    def summary(self) -> dict:
        return {
            "fg_wait_s": _percentiles(self.fg_waits),
            "fg_ttft_s": _percentiles(self.fg_ttft),
            "fg_itl_s": _percentiles(self.fg_itl),
            "fg_turn_s": _percentiles(self.fg_turn),
            "bg_tok_per_s": self.bg_tokens / self.span_s if self.span_s else 0.0,
            "preemptions": self.preemptions,
            "recomputed_tokens": self.recomputed_tokens,
            "prompt_reused": self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0,
            "swapped_mb": self.swapped_bytes / 1e6,
            "abandoned_steps": self.abandoned_steps,
        }


class Tally:
    """Counts a run's scheduler events into its Result."""

    def __init__(self, result: Result) -> None:
        self.result = result
        # By turn: its prompt's length till it is admitted, and what its recomputes
        # found in the prefix cache (in its end's count too, but no prompt's tokens).
        self.prompts: dict[int, int] = {}
        self.recached: dict[int, int] = {}

    def count(self, event: Event) -> None:
        result = self.result
        match event:  # (every turn's three first: one of each a turn)
            case Queued(turn=turn, tokens=tokens):
                self.prompts[turn] = tokens
            case Admitted(turn=turn):
                result.prompt_tokens += self.prompts.pop(turn)
            case Ended(turn=turn, cached_tokens=cached):
                result.cached_tokens += cached - self.recached.pop(turn, 0)
            case Preempted():
                result.preemptions += 1
            case Recomputed(turn=turn, tokens=tokens, cached_tokens=cached):
                result.recomputed_tokens += tokens
                self.recached[turn] = self.recached.get(turn, 0) + cached


def _percentiles(samples: list[float]) -> dict[str, float]:
    return percentiles(samples or [0.0])  # the table always has a row


def may_hit(workload: Workload, policy: Policy) -> bool:
    """Whether the prefix cache can serve any turn of the run. Without a shared
    prompt (`prefix_share` 0) no two turns start alike, so a turn's blocks can
    serve only the turn itself, once it has lost them: under recompute, and
    under no other policy here (a swap's host room is unbounded, and no KV move
    fails). A cache that cannot hit decides nothing, and is left out: the same
    decisions, without the work of filing every block (tests/test_sim.py)."""
    return workload.prefix_share > 0 or policy is Policy.RECOMPUTE


def simulate(
    workload: Workload,
    policy: str,
    progress: Callable[[int], None] = lambda n: None,
    *,
    events: Callable[[Event], None] | None = None,
    fast_forward: bool = True,
) -> Result:
    """Run the workload under one policy; `progress(n)` is told of each arrival,
    `events` (if given) of every decision. Without `fast_forward` every step is a
    round of its own: the same decisions, priced step by step (for the tests)."""
    rng = np.random.default_rng(workload.seed)
    gaps = rng.exponential(workload.foreground_interval_s, workload.arrivals)
    arrivals = (workload.warmup_s + np.cumsum(gaps)).tolist()  # (Python floats: asked at every round)
    fg_lengths = list(workload.foreground.sample(rng, workload.arrivals))
    bg_rng = np.random.default_rng(workload.seed + 1)  # same background stream for every policy
    bg_pool = iter(())

    def bg_length() -> int:
        nonlocal bg_pool
        try:
            return next(bg_pool)
        except StopIteration:
            bg_pool = iter(workload.background.sample(bg_rng, 4096).tolist())  # (Python ints, made at once)
            return next(bg_pool)

    result = Result(policy)
    tally = Tally(result)

    def count(event: Event) -> None:
        events(event)  # type: ignore[misc]
        tally.count(event)

    if not 0 <= workload.prefix_share <= 1:
        raise ConfigError(f"prefix_share must be in [0, 1], got {workload.prefix_share}")
    fresh = 1 << 20  # the next token id no prompt shares

    @functools.cache
    def repeated(agent: str, shared: int) -> tuple[int, ...]:
        """The first `shared` tokens of every prompt of the agent (made once per agent)."""
        return tuple(zlib.crc32(f"{agent} {i}".encode()) & 0xFFFFF for i in range(shared))

    def prompt(agent: str, n: int) -> list[int]:
        nonlocal fresh
        shared = round(workload.prefix_share * n)
        first, fresh = fresh, fresh + n - shared
        return [*repeated(agent, shared), *range(first, fresh)]

    parsed = Policy.parse(policy)
    config = SchedulerConfig(
        slots=workload.slots,
        policy=parsed,
        step_tokens=workload.step_tokens,
        aging_s=workload.aging_s,
        shaping=workload.shaping,
        slack=workload.slack,
        prefix_cache=workload.prefix_cache and may_hit(workload, parsed),
        abandon_steps=workload.abandon_steps,
    )
    engine = TimingEngine(workload.timing, block_size=workload.block_size)
    emit = tally.count if events is None else count  # (a few events a round: no call more than needed)
    sched = Scheduler(config, BlockPool(workload.num_blocks, workload.block_size), emit=emit, cost=engine.cost)
    last_token: dict[int, float] = {}  # foreground turn -> when its latest token came

    def before_arrival(span_s: Callable[[int], float], overhead_s: float, steps: int, now: float, arrival: float) -> int:
        """How many of the plan's `steps` (lasting `span_s(n)` for n of them, after
        `overhead_s`) to run before the next arrival: those that end before it, or
        just the first if it lands in that one (so it is taken in at the end of the
        very step it lands in, or stops it)."""
        if now + overhead_s + span_s(steps) <= arrival:
            return steps  # (what the search finds: the span grows with every step)
        lo, hi = 1, steps  # the most steps that end by the arrival, at least 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if now + overhead_s + span_s(mid) <= arrival:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def abandons(plan: Plan) -> bool:
        """Whether a foreground arrival stops this plan's step (runtime.owner.abandon)."""
        bar = abandon_bar(plan, sched)
        return bar is not None and FOREGROUND > bar

    def submit_bg(agent: str, now: float) -> None:
        sched.submit(agent, BACKGROUND, prompt(agent, workload.background_prompt), bg_length(), now, ignore_eos=True)

    for i in range(workload.background_agents):
        submit_bg(f"bg{i}", 0.0)
    # The foreground turns not yet ended (each leaves as it ends, its last token
    # delivered): kept to the end, every turn of a long run would lengthen each
    # pass of the garbage collector as it goes on.
    foreground: dict[int, Turn] = {}
    now, next_fg, slots, bg_tokens = 0.0, 0, workload.slots, 0
    while next_fg < len(arrivals) or foreground:
        while next_fg < len(arrivals) and arrivals[next_fg] <= now:
            turn = sched.submit(
                "fg", FOREGROUND, prompt("fg", workload.foreground_prompt), int(fg_lengths[next_fg]), arrivals[next_fg], ignore_eos=True
            )
            foreground[turn.id] = turn
            next_fg += 1
            progress(1)
        horizon = arrivals[next_fg] if next_fg < len(arrivals) else None  # the next event
        aging = sched.next_aging(now)
        if aging is not None and (horizon is None or aging < horizon):
            horizon = aging
        # A decode step of every slot bounds the steps to come from above, so
        # skipping ahead by it never runs past the horizon by more than a step.
        running = sched.running.values()
        context = len(running) + slots
        for t in running:  # (a loop, not a comprehension: no call more than needed, at every round)
            context += len(t.prompt) + len(t.output)
        step_s = engine.cost.predict(slots, context)
        steps = max(1, math.ceil((horizon - now) / step_s)) if horizon is not None else 1 << 30
        plan = sched.schedule(now)
        steps = sched.repeatable(plan, steps) if fast_forward else 1
        if not plan.works:  # idle until the next arrival
            now = max(now, horizon) if horizon is not None else now + step_s
            continue
        # (priced once: the plan does not change until it is accounted)
        overhead_s, (first_s, next_s), items = engine.overhead_s(plan), engine.first_and_next_s(plan), len(plan.works)

        span_s = functools.partial(engine.steps_s, first_s, next_s, items)  # the plan's n steps last span_s(n)

        if next_fg < len(arrivals):
            steps = before_arrival(span_s, overhead_s, steps, now, arrivals[next_fg])
            if steps == 1 and abandons(plan):
                # The arrival stops the step it lands in: it counts for nothing.
                start = now + overhead_s
                stop = stopped_after(arrivals[next_fg] - start, first_s)
                if stop is not None:
                    result.abandoned_steps += 1
                    now = start + stop
                    continue
        for waited in foreground.values():
            if waited.admitted_at == now:  # (a wait ends: rarely, so asked of the few first)
                for turn in plan.turns:
                    if turn.agent == "fg" and turn.computed == turn.cached_tokens and turn.admitted_at == now and not turn.output:
                        result.fg_waits.append(now - turn.arrived + overhead_s)
                break
        if plan.moves:
            moved = sum(n for _, _, n in plan.swap_out) + sum(len(b) * workload.block_size for _, b in plan.swap_in)
            result.swapped_bytes += moved * workload.timing.kv_bytes_per_token
        tokens = engine.step(plan.works)
        first = now + overhead_s + first_s
        now += overhead_s + span_s(steps)
        rest = (now - first) / (steps - 1) if steps > 1 else 0.0
        counted = steps if now > workload.warmup_s else 0  # (each background token after the warm-up)
        for turn, _ in sched.postprocess(plan, tokens, now, repeats=steps):
            if turn.agent == "fg":
                if turn.id in last_token:
                    result.fg_itl.append(first - last_token[turn.id])
                else:
                    result.fg_ttft.append(first - turn.arrived)
                result.fg_itl.extend([rest] * (steps - 1))
                last_token[turn.id] = now
                if turn.done:
                    result.fg_turn.append(now - turn.arrived)
                    del last_token[turn.id], foreground[turn.id]
                continue
            bg_tokens += counted
            if turn.ended is not None:  # (Turn.done, inlined: asked of every token delivered)
                submit_bg(turn.agent, now)
    result.bg_tokens = bg_tokens
    result.span_s = now - workload.warmup_s
    result.steps = sched.step
    return result
