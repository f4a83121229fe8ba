"""`swarm bench owner`: how much host time the GPU owner spends per step.

The engine is the timing model with no cost at all (its step returns at once,
so the owner calls it inline: runtime.scheduling.work's `blocking`), so every
microsecond measured is the owner's own work, and the agents': draining
requests, scheduling, delivering each token to its agent, publishing events.
The same runs again through the step thread a blocking engine's steps go to,
which adds the hand-over each way: two thread wake-ups a step, whose cost
varies with the host's load. With a real device that hand-over overlaps the
step on the device (the idle figure below).

Two figures per configuration:
- host ms per step: all of that work, 1 / steps per second;
- gap ms per step: the part between one step's end and the next one's start,
  when a real device would sit idle. The owner delivers a step's tokens while
  the next step runs, so only postprocess, schedule and the launch count here.

and the process's CPU time per step over the same window (all its threads): on
a machine shared with other work the wall time also counts waiting for a core,
and this does not, so two runs compare better by it.

The owner learns its step cost law from every step, as it does on a real engine
(the timing model's own law is exact and learns nothing, so the bench gives it
one that learns, anchored on the model's prices): that work is the owner's too.

With a device that takes time (`--device-ms`, the timing model sleeping
through each step as a step thread waits on a device, the GIL released), it
also measures how long the device sits idle between two steps, at the
engine's own door (a step's return to the next step's call): the owner plans
step N+1 while step N runs, so only the hand-over from one to the next is left.

Each configuration keeps every slot busy: `agents` background agents, each
asking for one long turn after another and reading every token of it. The
tokens they read in the measured window are counted too: a figure is only the
owner's if its agents kept up (tokens read per step = the slots in use).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import anyio

from runtime.agent import Agent
from runtime.events.kinds import Admitted
from runtime.scheduling.cost import StepCost, kv_reads
from runtime.scheduling.priority import BACKGROUND
from runtime.scheduling.timing import TimingEngine, TimingModel

CONFIGS = ((8, 8), (8, 64), (64, 64))  # (slots, agents)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=2000, metavar="N", help="measured steps per configuration")
    parser.add_argument("--repeats", type=int, default=3, metavar="R", help="runs per configuration; the best is reported")
    parser.add_argument("--turn-tokens", type=int, default=512, metavar="N", help="tokens per background turn")
    parser.add_argument(
        "--device-ms",
        type=float,
        default=2.0,
        metavar="MS",
        help="step time of the device whose idle time between steps is measured (0: skip)",
    )
    parser.add_argument("--device-seconds", type=float, default=3.0, metavar="S", help="how long to measure it")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


class Busy(Agent):
    """One long turn after another, reading every token (counted in `read[0]`)."""

    def __init__(self, name: str, tokens: int, read: list[int]) -> None:
        super().__init__(name, BACKGROUND)
        self.tokens = tokens
        self.read = read  # shared by all the agents of a run

    async def run(self) -> None:
        while True:
            async with self.generate([1, 2, 3, 4, 5, 6, 7, 8], max_tokens=self.tokens, ignore_eos=True) as turn:
                async for _ in turn:
                    self.read[0] += 1


def learning_law(engine: TimingEngine) -> StepCost:
    """A cost law that refits from measured steps, as a real engine's does,
    anchored like its calibration on decodes and prefills priced by the model."""
    law = engine.model.cost()
    shapes = [(b, b * (p + 1)) for p in (16, 400) for b in (1, 2, 4, 8, 16)] + [(n, kv_reads(0, n)) for n in (32, 128, 512)]
    cost = StepCost(law.fixed_s, law.token_s, law.kv_s)
    cost.calibrate([(tokens, kv, law.predict(tokens, kv)) for tokens, kv in shapes])
    return cost


async def measure(slots: int, agents: int, steps: int, turn_tokens: int, threaded: bool = False) -> dict[str, Any]:
    from swarm.api import Swarm

    engine = TimingEngine(realtime=False)
    engine.blocking = threaded  # (True: its steps go through the step thread, as a device's would)
    engine.cost = learning_law(engine)
    read = [0]
    async with Swarm(engine, slots=slots) as swarm:
        for i in range(agents):
            await swarm.spawn(Busy(f"a{i}", turn_tokens, read))
        while swarm.bus.counts[Admitted] < min(slots, agents):
            await anyio.sleep(0.01)
        owner, sched = swarm.owner, swarm.owner.scheduler
        owner.gap_seconds.clear()
        first, started, cpu, read_before = sched.step, time.perf_counter(), time.process_time(), read[0]
        while sched.step < first + steps:
            await anyio.sleep(0.01)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        done, tokens_read = sched.step - first, read[0] - read_before
        gap = statistics.median(owner.gap_seconds)
    return {
        "slots": slots, "agents": agents, "steps": done, "steps_per_s": done / elapsed,
        "host_ms_per_step": 1e3 * elapsed / done, "cpu_ms_per_step": 1e3 * cpu / done, "gap_ms_per_step": 1e3 * gap,
        "tokens_read_per_step": tokens_read / done,
    }  # fmt: skip


class DoorEngine(TimingEngine):
    """The timing model in real time, noting when each step comes in and goes out."""

    def __init__(self, step_s: float) -> None:
        super().__init__(TimingModel(decode_step_s=step_s, prefill_tok_per_s=1e9, kv_read_s=0.0), realtime=True)
        self.doors: list[tuple[float, float, int]] = []  # (in, out, works) per step

    def step(self, batch, abandon=None):  # type: ignore[no-untyped-def]
        came = time.perf_counter()
        tokens = super().step(batch, abandon)
        self.doors.append((came, time.perf_counter(), len(batch)))
        return tokens


async def measure_device(step_ms: float, seconds: float, slots: int = 8) -> dict[str, Any]:
    """Device idle between two full decode steps, every slot busy."""
    from swarm.api import Swarm

    engine = DoorEngine(step_ms / 1e3)
    async with Swarm(engine, slots=slots) as swarm:
        for i in range(slots):
            await swarm.spawn(Busy(f"a{i}", 4096, [0]))
        with anyio.fail_after(60):
            while swarm.bus.counts[Admitted] < slots:
                await anyio.sleep(0.01)
        await anyio.sleep(0.2)  # past the prompts
        first = len(engine.doors)
        await anyio.sleep(seconds)
        doors = engine.doors[first:]
    idle = [b[0] - a[1] for a, b in zip(doors, doors[1:], strict=False) if a[2] == b[2] == slots] or [float("nan")]
    steps = [out - came for came, out, _ in doors] or [float("nan")]
    return {
        "slots": slots, "step_ms": 1e3 * statistics.median(steps), "steps": len(doors),
        "idle_ms_per_step": 1e3 * statistics.median(idle), "idle_ms_mean": 1e3 * statistics.mean(idle),
        "idle_share": statistics.median(idle) / statistics.median(steps),
    }  # fmt: skip


def _line(r: dict[str, Any]) -> str:
    per_token = r["host_ms_per_step"] / min(r["slots"], r["agents"]) * 1e3
    return (
        f"  {r['slots']:3d} slots, {r['agents']:3d} agents: {r['host_ms_per_step']:6.3f} ms/step "
        f"({r['steps_per_s']:6.0f} steps/s, {per_token:5.1f} us per token, CPU {r['cpu_ms_per_step']:6.3f} ms), "
        f"between steps {r['gap_ms_per_step']:6.3f} ms (median), agents read {r['tokens_read_per_step']:5.1f} tokens/step"
    )


def check(args: argparse.Namespace) -> None:
    from runtime.errors import ConfigError

    for flag, value in (("--steps", args.steps), ("--repeats", args.repeats), ("--turn-tokens", args.turn_tokens)):
        if value < 1:
            raise ConfigError(f"{flag} must be at least 1, got {value}")
    if not args.device_ms >= 0 or args.device_ms > 1000:
        raise ConfigError(f"--device-ms must be between 0 and 1000, got {args.device_ms}")
    if args.device_ms and not 0 < args.device_seconds <= 600:
        raise ConfigError(f"--device-seconds must be above 0 and at most 600, got {args.device_seconds}")


def run(args: argparse.Namespace) -> int:
    check(args)
    results, threaded = [], []
    for slots, agents in CONFIGS:
        for into, through in ((results, False), (threaded, True)):
            runs = [anyio.run(measure, slots, agents, args.steps, args.turn_tokens, through) for _ in range(args.repeats)]
            into.append(min(runs, key=lambda r: r["host_ms_per_step"]))
    device = anyio.run(measure_device, args.device_ms, args.device_seconds) if args.device_ms else None
    if args.json:
        print(json.dumps({"engine": "timing model, zero cost", "configs": results, "threaded": threaded, "device": device}))
    else:
        print(f"owner host work per step, zero-cost engine called inline (best of {args.repeats} runs)")
        for r in results:
            print(_line(r))
        print("the same through the step thread, as a blocking engine's steps go")
        for r in threaded:
            print(_line(r))
        if device is not None:
            print(
                f"  device idle between steps, a {device['step_ms']:.2f} ms step at {device['slots']} slots: "
                f"{device['idle_ms_per_step']:.3f} ms (median; mean {device['idle_ms_mean']:.3f} ms), "
                f"{100 * device['idle_share']:.1f}% of a step"
            )
    return 0
