"""The load every swarm bench drives, and the figures it yields.

Closed-loop background agents keep the slots busy (a new turn the moment the
last ends), with lengths from the seed workload's mixture (`swarm.sim.Lengths`)
and `ignore_eos`, so the lengths hold. A foreground agent is a person: a turn,
a random pause, the next turn. Prompts are a mixture around 300 tokens, as real
agent prompts are. `swarm bench swarm`, `--cluster` and `bench serve` all drive
this load, so their figures mean the same thing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import numpy as np

from runtime.scheduling.units import percentiles
from swarm import BACKGROUND, FOREGROUND, Agent
from swarm.sim import Lengths

FEEL = ("fg_ttft_s", "fg_itl_s", "fg_turn_s")  # what solo is measured for


@dataclass
class Stats:
    measuring: bool = False
    fg_live: bool = False
    fg_live_s: float = 0.0  # measured seconds with a foreground turn live
    bg_tokens: int = 0
    bg_tokens_idle: int = 0  # decoded while no foreground turn was live
    bg_paused_s: float = 0.0
    fg_wait_s: list[float] = field(default_factory=list)
    fg_ttft_s: list[float] = field(default_factory=list)
    fg_itl_s: list[float] = field(default_factory=list)
    fg_turn_s: list[float] = field(default_factory=list)
    fg_tokens_s: list[list[float]] = field(default_factory=list)  # each turn's token times from its request
    fg_late_s: list[float] = field(default_factory=list)  # how late the person's timer woke to ask: the event loop's lag

    def decoded(self, n: int) -> None:
        if self.measuring:
            self.bg_tokens += n
            self.bg_tokens_idle += n * (not self.fg_live)


def prompts(mean: int, rng: np.random.Generator, vocab: int = 200) -> Iterator[list[int]]:
    lengths = Lengths(mean=float(mean), sigma=0.5, min=min(32, mean), max=4 * mean)
    while True:
        yield (20 + rng.integers(0, vocab, int(lengths.sample(rng, 1)[0]))).tolist()


class Background(Agent):
    """Closed loop: one turn after another, lengths drawn from the mixture."""

    def __init__(self, name: str, lengths: Iterator[int], prompts: Iterator[list[int]], stats: Stats) -> None:
        super().__init__(name, BACKGROUND)
        self.lengths, self.prompts, self.stats = lengths, prompts, stats

    async def run(self) -> None:
        while True:
            async with self.generate(next(self.prompts), max_tokens=next(self.lengths), ignore_eos=True) as turn:
                seen = 0
                async for _ in turn:  # text pieces: several tokens may make one
                    self.stats.decoded(len(turn.tokens) - seen)
                    seen = len(turn.tokens)
            self.stats.decoded(len(turn.tokens) - seen)
            if self.stats.measuring:
                self.stats.bg_paused_s += turn.paused_s


class Foreground(Agent):
    """A person: a turn, then a pause of random length, then the next. `turns`
    stops it after that many (the solo run)."""

    def __init__(
        self, name: str, gaps: Iterator[float], prompts: Iterator[list[int]], tokens: int, stats: Stats, turns: int | None = None
    ) -> None:
        super().__init__(name, FOREGROUND)
        self.gaps, self.prompts, self.tokens, self.stats, self.turns = gaps, prompts, tokens, stats, turns

    async def run(self) -> None:
        done = 0
        while self.turns is None or done < self.turns:
            gap, slept = next(self.gaps), time.monotonic()
            await anyio.sleep(gap)
            started = time.monotonic()
            prompt = next(self.prompts)
            self.stats.fg_live = True
            try:
                async with self.generate(prompt, max_tokens=self.tokens, ignore_eos=True) as turn:
                    async for _ in turn:
                        pass
            finally:
                self.stats.fg_live = False
                if self.stats.measuring:
                    self.stats.fg_live_s += time.monotonic() - started
            done += 1
            if turn.waited_s is not None and turn.ttft_s is not None:
                s = self.stats
                s.fg_late_s.append(max(0.0, started - slept - gap))
                s.fg_wait_s.append(turn.waited_s)
                s.fg_ttft_s.append(turn.ttft_s)
                s.fg_itl_s += turn.itl_s
                s.fg_turn_s.append(turn.turn_s)
                s.fg_tokens_s.append([t - turn.queued_t for t in turn.token_times])


def streams(args: argparse.Namespace):
    """The same random draws for every policy: background lengths and prompts,
    foreground gaps and prompts (each stream its own generator)."""
    seeds = np.random.SeedSequence(args.seed).spawn(4)
    mixture = Lengths(max=args.bg_max)
    rng = np.random.default_rng(seeds[0])
    lengths = (int(n) for n in iter(lambda: mixture.sample(rng, 1)[0], None))
    gap_rng = np.random.default_rng(seeds[1])
    gaps = (float(g) for g in iter(lambda: gap_rng.exponential(args.fg_interval), None))
    return lengths, gaps, prompts(args.prompt, np.random.default_rng(seeds[2])), prompts(args.prompt, np.random.default_rng(seeds[3]))


def row(stats: Stats, elapsed: float, preemptions: int, steps: list[float], abandoned: int = 0) -> dict[str, Any]:
    """One policy's figures from a measured run: what the foreground felt and the background got."""
    idle_s = elapsed - stats.fg_live_s
    return {
        **feel(stats),
        "fg_wait_s": percentiles(stats.fg_wait_s),
        "fg_late_s": percentiles(stats.fg_late_s),
        "fg_turns": len(stats.fg_wait_s),
        "bg_tok_per_s": stats.bg_tokens / elapsed,
        "bg_tok_per_s_idle": stats.bg_tokens_idle / idle_s if idle_s > 0 else None,
        "preemptions": preemptions,
        "abandoned_steps": abandoned,  # stopped early for a foreground arrival (runtime.owner.abandon)
        "step_s_median": statistics.median(steps) if steps else None,
        "paused_s": stats.bg_paused_s,
        "seconds": elapsed,
    }


def feel(stats: Stats) -> dict[str, Any]:
    return {"fg_ttft_s": percentiles(stats.fg_ttft_s), "fg_itl_s": percentiles(stats.fg_itl_s), "fg_turn_s": percentiles(stats.fg_turn_s)}


def vs_solo(result: dict[str, Any], solo: dict[str, Any]) -> dict[str, float | None]:
    """Each percentile of what the person feels, over the same on the idle engine."""
    out: dict[str, float | None] = {}
    for key in FEEL:
        mine, base = result.get(key), solo.get(key)
        for p in ("p50", "p99"):
            ok = mine and base and base[p] > 0
            out[f"{key[3:-2]}_{p}"] = mine[p] / base[p] if ok else None
    return out
