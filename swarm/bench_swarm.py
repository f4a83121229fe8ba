"""`swarm bench swarm`: foreground wait under each policy, on the real engine.

N slots are kept busy by closed-loop background agents (a new turn the moment
the last ends) whose lengths come from the seed workload's mixture
(`swarm.sim.Lengths`), with `ignore_eos` so the lengths hold. A foreground
agent sends turns at random (exponential gaps), one at a time, like a person.
Each policy gets a fresh Swarm over the same engine object (built once).

Per policy: foreground wait (request to slot) and time to first token,
background tokens/s, preemptions, time background turns spent paused, and the
median engine step. Under `resident` the wait is bounded by a step or so; under
`priority` and `fcfs` it follows how long background turns run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import anyio
import numpy as np

from runtime.errors import ConfigError
from runtime.events import Admitted, Preempted
from runtime.turns import Policy
from swarm import BACKGROUND, FOREGROUND, Agent, Swarm
from swarm.summary import percentiles
from swarm.sim import Lengths


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=60.0, help="measured seconds per policy (after the warm-up)")
    parser.add_argument("--policies", default="resident,priority,fcfs", help="comma-separated, from: " + ", ".join(p.value for p in Policy))
    parser.add_argument("--json", action="store_true", help="print one JSON object (with raw samples, for swarm plot)")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--model", help="GGUF model file (default: the default model)")
    parser.add_argument("--device", help="OpenCL device (default: the first one)")
    parser.add_argument("--kernels", choices=("auto", "cpu", "gpu"), default="auto", help="kernel family: auto (shaped for the device), cpu or gpu")
    parser.add_argument("--fg-interval", type=float, default=5.0, help="mean seconds between foreground turns")
    parser.add_argument("--fg-tokens", type=int, default=16, help="tokens per foreground turn")
    parser.add_argument("--bg-max", type=int, default=256, help="clip background turn lengths (a CPU decodes slowly)")
    parser.add_argument("--step-tokens", type=int, default=16, help="tokens one step may process (small on a CPU: a prefill chunk lengthens its step, and so the wait)")
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens per turn")
    parser.add_argument("--warmup", type=float, default=30.0, help="at most this many seconds for every slot to fill first")
    parser.add_argument("--seed", type=int, default=0)


@dataclass
class Stats:
    measuring: bool = False
    bg_tokens: int = 0
    bg_paused_s: float = 0.0
    fg_wait_s: list[float] = field(default_factory=list)
    fg_ttft_s: list[float] = field(default_factory=list)


class Background(Agent):
    """Closed loop: one turn after another, lengths drawn from the mixture."""

    def __init__(self, name: str, lengths: Iterator[int], prompt: list[int], stats: Stats) -> None:
        super().__init__(name, BACKGROUND)
        self.lengths, self.prompt, self.stats = lengths, prompt, stats

    async def run(self) -> None:
        while True:
            async with self.generate(self.prompt, max_tokens=next(self.lengths), ignore_eos=True) as turn:
                async for _ in turn:
                    self.stats.bg_tokens += self.stats.measuring
            if self.stats.measuring:
                self.stats.bg_paused_s += turn.paused_s


class Foreground(Agent):
    """A person: a turn, then a pause of random length, then the next."""

    def __init__(self, name: str, gaps: Iterator[float], prompt: list[int], tokens: int, stats: Stats) -> None:
        super().__init__(name, FOREGROUND)
        self.gaps, self.prompt, self.tokens, self.stats = gaps, prompt, tokens, stats

    async def run(self) -> None:
        while True:
            await anyio.sleep(next(self.gaps))
            async with self.generate(self.prompt, max_tokens=self.tokens, ignore_eos=True) as turn:
                async for _ in turn:
                    pass
            if turn.waited_s is not None and turn.ttft_s is not None:
                self.stats.fg_wait_s.append(turn.waited_s)
                self.stats.fg_ttft_s.append(turn.ttft_s)


async def bench_policy(engine: Any, policy: str, args: argparse.Namespace) -> dict[str, Any]:
    """One policy on a fresh Swarm; the same random draws for every policy."""
    rng = np.random.default_rng(args.seed)
    mixture = Lengths(max=args.bg_max)
    lengths = (int(n) for n in iter(lambda: mixture.sample(rng, 1)[0], None))
    gaps = (float(g) for g in iter(lambda: rng.exponential(args.fg_interval), None))
    prompt = [20 + i % 200 for i in range(args.prompt)]
    stats = Stats()
    swarm = Swarm(engine, slots=args.slots, policy=policy, step_tokens=args.step_tokens)
    async with swarm:
        for i in range(args.slots):
            await swarm.spawn(Background(f"bg{i}", lengths, prompt, stats))
        with anyio.move_on_after(args.warmup):  # every slot busy before measuring
            while swarm.bus.counts[Admitted] < args.slots:
                await anyio.sleep(0.05)
        steps_before = len(swarm.owner.step_seconds)
        preempted_before = swarm.bus.counts[Preempted]
        stats.measuring = True
        started = time.monotonic()
        await swarm.spawn(Foreground("fg", gaps, prompt, args.fg_tokens, stats))
        await anyio.sleep(args.seconds)
        stats.measuring = False
        elapsed = time.monotonic() - started
        steps = swarm.owner.step_seconds[steps_before:]
        preemptions = swarm.bus.counts[Preempted] - preempted_before
    return {
        "fg_wait_s": percentiles(stats.fg_wait_s),
        "fg_ttft_s": percentiles(stats.fg_ttft_s),
        "fg_turns": len(stats.fg_wait_s),
        "bg_tok_per_s": stats.bg_tokens / elapsed,
        "preemptions": preemptions,
        "step_s_median": statistics.median(steps) if steps else None,
        "paused_s": stats.bg_paused_s,
        "seconds": elapsed,
        "fg_wait_samples_s": stats.fg_wait_s,
        "fg_ttft_samples_s": stats.fg_ttft_s,
    }


def parse_policies(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise ConfigError("--policies: name at least one policy")
    return [Policy.parse(n).value for n in names]


def load_engine(args: argparse.Namespace) -> Any:
    from gpu.engine import OpenCLEngine
    from gpu.fetch import resolve_model

    return OpenCLEngine(resolve_model(args.model), device=args.device, kernels=args.kernels)


def run(args: argparse.Namespace, engine: Any = None) -> int:
    policies = parse_policies(args.policies)
    for flag in ("seconds", "fg_interval"):
        if getattr(args, flag) <= 0:
            raise ConfigError(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    engine = engine or load_engine(args)
    results: dict[str, Any] = {}
    for policy in policies:
        if not args.json:
            print(f"{policy}: {args.seconds:.0f} s ...", file=sys.stderr, flush=True)
        results[policy] = anyio.run(bench_policy, engine, policy, args)
    out = {
        "workload": {"slots": args.slots, "seconds": args.seconds, "fg_interval_s": args.fg_interval, "fg_tokens": args.fg_tokens,
                     "bg_max": args.bg_max, "step_tokens": args.step_tokens, "prompt": args.prompt, "seed": args.seed,
                     "device": getattr(engine, "device_name", type(engine).__name__)},
        "policies": results,
    }
    if args.json:
        json.dump(out, sys.stdout)
        print()
    else:
        print_table(out)
    return 0


def print_table(out: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    w = out["workload"]
    table = Table(title=f"{w['slots']} slots on {w['device']}, foreground every ~{w['fg_interval_s']:.0f} s, background <= {w['bg_max']} tokens")
    for col in ("policy", "fg turns", "fg wait p50", "p90", "p99", "max", "ttft p50", "p99", "bg tok/s", "preemptions", "bg paused", "step median"):
        table.add_column(col, justify="right")
    for name, r in out["policies"].items():
        wait, ttft = r["fg_wait_s"] or {}, r["fg_ttft_s"] or {}
        table.add_row(
            name, str(r["fg_turns"]), *(_s(wait.get(k)) for k in ("p50", "p90", "p99", "max")), _s(ttft.get("p50")), _s(ttft.get("p99")),
            f"{r['bg_tok_per_s']:.1f}", str(r["preemptions"]), _s(r["paused_s"]), _s(r["step_s_median"]),
        )
    Console().print(table)


def _s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.2f} s"
