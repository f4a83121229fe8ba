"""`swarm bench swarm`: what the person at the foreground feels, per policy, on
the real engine under full background load.

N slots are kept busy by the load of `swarm.bench.load`. Each policy
gets a fresh Swarm over the same engine object (built and calibrated once); the
i-th foreground turn has the same prompt and length under every policy.

Per policy: how late the foreground's timer woke to ask (the event loop's lag
while steps run), the foreground's wait (request to slot), time to first token, time
between tokens and turn time (request to last token), each p50/p90/p99/max;
background tokens decoded per second, overall and while no foreground turn was
live; preemptions; the median engine step. `solo` runs the same foreground turns
on the idle engine in the same run, right after each policy (the machine's load
drifts), so every figure has its own ratio to idle (`vs_solo`, against the solo
run next to it); `solo` in the output pools them all.

A policy written `name:unshaped` runs with step shaping off (as `--no-shaping`
does for all), `name:whole` with every step run whole (no step abandoned for
a foreground arrival, runtime.owner.abandon), `name:spec` with speculative
decoding by prompt lookup and `name:draft` by a draft model (`--draft`), so
each can be compared in one run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import anyio

from runtime.errors import ConfigError
from runtime.events.kinds import Admitted, Preempted, StepAbandoned
from runtime.scheduling.turns import Policy
from runtime.scheduling.units import format_duration
from runtime.scheduling.work import Engine
from swarm import Swarm
from swarm.bench.load import Background, Foreground, Stats, feel, row, streams, vs_solo


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=60.0, help="measured seconds per policy (after the warm-up)")
    parser.add_argument(
        "--policies",
        default="resident,priority,fcfs",
        help="comma-separated, from: "
        + ", ".join(p.value for p in Policy)
        + " (NAME:unshaped turns step shaping off for that one, NAME:whole never abandons a step, "
        "NAME:spec turns speculative decoding by prompt lookup on, NAME:draft by a draft model)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object (with raw samples, for swarm plot)")
    parser.add_argument("--slots", type=int, default=8, help="turns decoded together")
    parser.add_argument(
        "--model",
        help="GGUF path, catalogue name (smollm2-135m, the default; qwen2.5-coder-0.5b; qwen2.5-coder-1.5b; gemma3-270m; "
        "see swarm models) or hf:OWNER/REPO/FILE; env SWARM_MODEL",
    )
    parser.add_argument("--device", help="OpenCL device (default: a GPU if any, else the first usable; env SWARM_DEVICE)")
    parser.add_argument(
        "--kernels", choices=("auto", "cpu", "gpu"), default="auto", help="kernel family: auto (shaped for the device), cpu or gpu"
    )
    parser.add_argument("--fg-interval", type=float, default=5.0, help="mean seconds between foreground turns")
    parser.add_argument("--fg-tokens", type=int, default=48, help="tokens per foreground turn")
    parser.add_argument("--bg-max", type=int, default=256, help="clip background turn lengths (a CPU decodes slowly)")
    parser.add_argument(
        "--step-tokens",
        type=int,
        default=16,
        help="tokens one step may process (small on a CPU: a prefill chunk lengthens its step, and so the wait)",
    )
    parser.add_argument(
        "--prompt", type=int, default=300, help="mean prompt tokens per turn (lognormal mixture, clipped to 32 .. 4x the mean)"
    )
    parser.add_argument("--no-shaping", action="store_true", help="turn step shaping off for every policy")
    parser.add_argument(
        "--slack", type=float, default=0.25, help="shaping: background decodes may lengthen a foreground step by this fraction"
    )
    parser.add_argument("--warmup", type=float, default=30.0, help="at most this many seconds for every slot to fill first")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the load")
    parser.add_argument(
        "--cluster",
        nargs="?",
        const="local",
        metavar="ADDRESS",
        help="the same load over GPU owners as Ray actors (a local Ray instance, or the cluster at ADDRESS)",
    )
    parser.add_argument("--owners", type=int, default=2, help="GPU owners with --cluster (default 2)")
    parser.add_argument("--draft", metavar="MODEL", help="the draft model of NAME:draft (default: the catalogue's for --model)")


def _swarm(engine: Engine, policy: str, args: argparse.Namespace) -> Swarm:
    name, _, variant = policy.partition(":")
    shaping = not args.no_shaping and variant != "unshaped"
    speculate = {"spec": "lookup", "draft": "draft"}.get(variant, "off")
    return Swarm(
        engine,
        slots=args.slots,
        policy=name,
        step_tokens=args.step_tokens,
        shaping=shaping,
        slack=args.slack,
        abandon_steps=variant != "whole",
        speculate=speculate,
        draft=getattr(args, "draft_engine", None) if speculate == "draft" else None,
    )


async def bench_policy(engine: Engine, policy: str, args: argparse.Namespace) -> dict[str, Any]:
    """One policy on a fresh Swarm under full background load."""
    lengths, gaps, bg_prompts, fg_prompts = streams(args)
    stats = Stats()
    swarm = _swarm(engine, policy, args)
    async with swarm:
        for i in range(args.slots):
            await swarm.spawn(Background(f"bg{i}", lengths, bg_prompts, stats))
        with anyio.move_on_after(args.warmup):  # every slot busy before measuring
            while swarm.bus.counts[Admitted] < args.slots:
                await anyio.sleep(0.05)
        steps_before = swarm.owner.steps_run
        preempted_before, abandoned_before = swarm.bus.counts[Preempted], swarm.bus.counts[StepAbandoned]
        stats.measuring = True
        started = time.monotonic()
        await swarm.spawn(Foreground("fg", gaps, fg_prompts, args.fg_tokens, stats))
        await anyio.sleep(args.seconds)
        stats.measuring = False
        elapsed = time.monotonic() - started
        steps = list(swarm.owner.step_seconds)[steps_before - swarm.owner.steps_run :] if swarm.owner.steps_run > steps_before else []
        preemptions = swarm.bus.counts[Preempted] - preempted_before
        abandoned = swarm.bus.counts[StepAbandoned] - abandoned_before
    return {
        **row(stats, elapsed, preemptions, steps, abandoned),
        "step_cost": engine.cost.coefficients,
        "fg_wait_samples_s": stats.fg_wait_s,
        "fg_ttft_samples_s": stats.fg_ttft_s,
        "fg_turn_samples_s": stats.fg_turn_s,
        "fg_token_times_s": stats.fg_tokens_s,
    }


async def bench_solo(engine: Engine, turns: int, args: argparse.Namespace, stats: Stats) -> Stats:
    """The first `turns` foreground turns, one after another, on the idle engine;
    their figures are added to `stats`."""
    _, _, _, fg_prompts = streams(args)
    # Idle speed is what the engine does best alone: preemptive, shaped unless told not to.
    async with _swarm(engine, Policy.RESIDENT.value, args) as swarm:
        fg = await swarm.spawn(Foreground("fg", iter(lambda: 0.05, None), fg_prompts, args.fg_tokens, stats, turns=turns))
        await swarm.join(fg)
    return stats


def _solo_result(stats: Stats) -> dict[str, Any]:
    return {**feel(stats), "fg_turns": len(stats.fg_turn_s), "fg_turn_samples_s": stats.fg_turn_s, "fg_token_times_s": stats.fg_tokens_s}


def _merge(a: Stats, b: Stats) -> Stats:
    out = Stats()
    for name in ("fg_ttft_s", "fg_itl_s", "fg_turn_s", "fg_tokens_s"):
        setattr(out, name, getattr(a, name) + getattr(b, name))
    return out


def parse_policies(text: str) -> list[str]:
    return Policy.parse_list(text, variants=("unshaped", "whole", "spec", "draft"))


def run(args: argparse.Namespace, engine: Engine | None = None) -> int:
    policies = args.policies_run = parse_policies(args.policies)
    for flag in ("seconds", "fg_interval", "prompt", "fg_tokens"):
        if getattr(args, flag) <= 0:
            raise ConfigError(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    if args.cluster is not None:
        from swarm.bench import cluster as bench_cluster

        return _report(args, f"cluster of {args.owners} owners", **bench_cluster.run(args, policies))
    if engine is None:
        from gpu.engine import open_engine

        engine = open_engine(args.model, args.device, kernels=args.kernels)
    if any(p.endswith(":draft") for p in policies):
        from swarm.api import open_draft

        args.draft_engine = open_draft(engine, args.draft)  # (opened once, as the engine is)
    results: dict[str, Any] = {}
    pooled = Stats()
    for policy in policies:
        if not args.json:
            print(f"{policy}: {args.seconds:.0f} s ...", file=sys.stderr, flush=True)
        results[policy] = r = anyio.run(bench_policy, engine, policy, args)
        # Solo right after each policy, over the same turns: on a shared machine the
        # load drifts, and a ratio is only fair between runs close in time.
        turns = max(r["fg_turns"], 1)
        if not args.json:
            print(f"solo: the same {turns} foreground turns on the idle engine ...", file=sys.stderr, flush=True)
        adjacent = anyio.run(bench_solo, engine, turns, args, Stats())
        r["vs_solo"] = vs_solo(r, feel(adjacent))
        pooled = _merge(pooled, adjacent)
    return _report(args, engine.device_name, policies=results, solo=_solo_result(pooled))


def _report(args: argparse.Namespace, device: str, **out: Any) -> int:
    out = {
        "workload": {
            "slots": args.slots,
            "seconds": args.seconds,
            "fg_interval_s": args.fg_interval,
            "fg_tokens": args.fg_tokens,
            "bg_max": args.bg_max,
            "step_tokens": args.step_tokens,
            "prompt": args.prompt,
            "seed": args.seed,
            "shaping": not args.no_shaping,
            "slack": args.slack,
            "device": device,
        },
        **out,
    }
    return report(out, args.json, _print_tables)


def _print_tables(out: dict[str, Any]) -> None:
    print_table(out)
    for name, owner in out.get("owners", {}).items():  # a cluster's owners, one by one
        print_table({**out, "workload": {**out["workload"], "device": f"owner {name}"}, **owner})


def report(out: dict[str, Any], as_json: bool, table: Any) -> int:
    """A bench's results: one JSON object (for swarm plot), or its table."""
    if as_json:
        json.dump(out, sys.stdout)
        print()
    else:
        table(out)
    return 0


def print_table(out: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    w = out["workload"]
    console = Console()
    console.print(
        f"{w['slots']} slots on {w['device']}, foreground every ~{w['fg_interval_s']:.0f} s ({w['fg_tokens']} tokens), "
        f"prompts ~{w['prompt']} tokens, background <= {w['bg_max']} tokens"
    )
    feel = Table(title="what the foreground feels (x solo: over the same turns on the idle engine)")
    for col in ("policy", "turns", "wait p50", "p99", "ttft p50", "p99", "x solo", "itl p50", "p99", "x solo", "turn p50", "p99", "x solo"):
        feel.add_column(col, justify="right")
    rows = [("solo", out["solo"], None)] + [(name, r, r["vs_solo"]) for name, r in out["policies"].items()]
    for name, r, ratio in rows:
        wait = r.get("fg_wait_s") or {}
        cells = [format_duration(wait.get("p50"), 0), format_duration(wait.get("p99"), 0)]
        for key, (p, x) in (("fg_ttft_s", ("p50", "ttft_p99")), ("fg_itl_s", ("p50", "itl_p50")), ("fg_turn_s", ("p50", "turn_p50"))):
            v = r.get(key) or {}
            cells += [
                format_duration(v.get(p), 0),
                format_duration(v.get("p99"), 0),
                "-" if ratio is None or ratio.get(x) is None else f"{ratio[x]:.2f}x",
            ]
        feel.add_row(name, str(r["fg_turns"]), *cells)
    console.print(feel)
    load = Table(title="the background")
    for col in ("policy", "bg tok/s", "with no fg live", "preemptions", "steps abandoned", "bg paused", "step median", "fg woke late p99"):
        load.add_column(col, justify="right")
    for name, r in out["policies"].items():
        idle, late = r["bg_tok_per_s_idle"], r.get("fg_late_s") or {}
        load.add_row(
            name,
            f"{r['bg_tok_per_s']:.1f}",
            "-" if idle is None else f"{idle:.1f}",
            str(r["preemptions"]),
            str(r.get("abandoned_steps", 0)),
            format_duration(r["paused_s"], 0),
            format_duration(r["step_s_median"], 0),
            format_duration(late.get("p99"), 0),
        )
    console.print(load)
