"""`swarm sim`: foreground wait under each policy on a simulated GPU."""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import Manager

import msgspec
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from runtime.scheduling.turns import Policy
from runtime.scheduling.units import format_duration
from swarm.sim import POLICIES, Workload, load_workload, may_hit, simulate

_LENGTHS = {
    "dist": "turn-length distribution of {who} turns: lognormal or pareto",
    "mean": "mean new tokens of a {who} turn",
    "sigma": "lognormal shape of {who} turn lengths",
    "alpha": "pareto shape of {who} turn lengths (smaller: heavier tail)",
    "min": "fewest new tokens of a {who} turn",
    "max": "most new tokens of a {who} turn",
}
WORKLOAD_FIELDS = {
    "slots": "turns decoded together",
    "background_agents": "background agents, each one turn after another",
    "background_prompt": "prompt tokens of a background turn",
    "foreground_prompt": "prompt tokens of a foreground turn",
    "foreground_interval_s": "mean seconds between foreground turns (exponential gaps)",
    "prefix_share": "share of each prompt that repeats the agent's earlier prompts (what the prefix cache can hit)",
    "prefix_cache": "share the K/V of prompts that start alike",
    "arrivals": "foreground turns simulated",
    "warmup_s": "seconds the background runs before the first foreground turn",
    "step_tokens": "tokens one step may process",
    "block_size": "positions per KV block",
    "aging_s": "seconds a waiting turn takes to gain one priority level",
    "timing.decode_step_s": "simulated GPU: seconds of one turn's decode step",
    "timing.prefill_tok_per_s": "simulated GPU: tokens per second a step computes past its first",
    "timing.kv_read_s": "simulated GPU: seconds of attention per KV position read",
    "timing.flush_s": "simulated GPU: seconds a preemption costs (drain and re-launch)",
    "timing.kv_bytes_per_token": "simulated GPU: KV bytes per token",
    "timing.swap_gb_s": "simulated GPU: host link GB/s for KV swaps",
    "timing.copy_gb_s": "simulated GPU: device memory GB/s for a block copy",
    "shaping": "build each step for the foreground turn",
    "slack": "how much longer than the foreground's own step a shaped step may be (0.25: 25%%)",
    "abandon_steps": "a foreground arrival stops the step in flight",
    "seed": "random seed of the arrivals and lengths",
    **{f"{who}.{key}": text.format(who=who) for who in ("background", "foreground") for key, text in _LENGTHS.items()},
}


def _workload_flags(workload: msgspec.Struct, prefix: str = "") -> list[tuple[str, type, object]]:
    """Every leaf field of the workload as a dotted flag name, e.g. background.mean,
    with its type and its value in `workload`."""
    flags = []
    for field in msgspec.structs.fields(workload):
        name = prefix + field.name
        value = getattr(workload, field.name)
        if isinstance(value, msgspec.Struct):
            flags += _workload_flags(value, name + ".")
        else:
            flags.append((name, type(value), value))
    return flags


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("sim", help="simulate the scheduler's policies on the reference workload", description=__doc__)
    p.add_argument("--workload", default="seed", help="'seed' (the reference workload) or a TOML file of workload fields")
    p.add_argument("--policies", default=",".join(POLICIES), help="comma-separated, from: " + ", ".join(POLICIES))
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--samples", action="store_true", help="with --json, include every foreground wait (for swarm plot)")
    p.add_argument("--jobs", type=int, default=2, help="policies simulated in parallel processes")
    group = p.add_argument_group("workload fields (override the workload)")
    for name, kind, seed in _workload_flags(Workload()):
        text = f"{WORKLOAD_FIELDS.get(name, 'the workload field ' + name)} (default: {seed} in the seed workload)"
        if kind is bool:  # --shaping / --no-shaping
            group.add_argument(f"--{name.replace('_', '-')}", dest=f"w:{name}", action=argparse.BooleanOptionalAction, help=text)
        else:
            group.add_argument(f"--{name.replace('_', '-')}", dest=f"w:{name}", type=kind, metavar=kind.__name__.upper(), help=text)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    overrides = {k[2:]: v for k, v in vars(args).items() if k.startswith("w:")}
    workload = load_workload(None if args.workload == "seed" else args.workload, **overrides)
    policies = Policy.parse_list(args.policies)
    results = _simulate_all(workload, policies, args.jobs, quiet=args.json)
    if args.json:
        out = {"workload": msgspec.to_builtins(workload), "policies": {}}
        for r in results:
            out["policies"][r.policy] = r.summary()
            if args.samples:
                out["policies"][r.policy]["fg_wait_samples_s"] = r.fg_waits
        json.dump(out, sys.stdout)
        print()
    else:
        _print_table(workload, results)
    return 0


def _simulate_all(workload: Workload, policies: list[str], jobs: int, quiet: bool):
    console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console, disable=quiet
    ) as bar:
        tasks = {p: bar.add_task(f"{p:>9}", total=workload.arrivals) for p in policies}
        if jobs <= 1 or len(policies) == 1:
            return [simulate(workload, p, lambda n, t=tasks[p]: bar.advance(t, n)) for p in policies]
        with Manager() as manager, ProcessPoolExecutor(max_workers=jobs) as pool:
            ticks = manager.Queue()
            shares = split(workload, list(dict.fromkeys(policies)), jobs)  # (a policy named twice runs once)
            futures = [pool.submit(_simulate_reporting, workload, share, ticks) for share in shares]
            while not all(f.done() for f in futures):
                try:
                    policy, n = ticks.get(timeout=0.1)
                    bar.advance(tasks[policy], n)
                except Exception:  # queue.Empty, as the manager raises it
                    pass
            results = {r.policy: r for f in futures for r in f.result()}
            return [results[p] for p in policies]


# A policy's rough cost, for `split`: preempting runs the background's
# resumes too, and a prefix cache that can hit files every block.
PREEMPTING_COST, CACHE_COST = 1.45, 1.4


def split(workload: Workload, policies: list[str], jobs: int) -> list[list[str]]:
    """The policies in at most `jobs` shares, each simulated in turn by one
    process: of every way to share them out, the one whose dearest share costs
    least, then the most even (a process taking the next policy as it frees up
    can be left running the last one alone)."""

    def cost(policy: str) -> float:
        parsed = Policy.parse(policy)
        cache = workload.prefix_cache and may_hit(workload, parsed)
        return (PREEMPTING_COST if parsed.preempts else 1.0) * (CACHE_COST if cache else 1.0)

    costs = [cost(p) for p in policies]
    jobs = min(jobs, len(policies))
    best, least = (), (math.inf, math.inf)
    for owners in itertools.product(range(jobs), repeat=len(policies)):
        sums = [sum(c for c, o in zip(costs, owners, strict=True) if o == share) for share in range(jobs)]
        key = (max(sums), sum(x * x for x in sums))
        if key < least:
            best, least = owners, key
    shares = [[p for p, o in zip(policies, best, strict=True) if o == share] for share in range(jobs)]
    return [share for share in shares if share]


def _simulate_reporting(workload: Workload, policies: list[str], ticks) -> list:
    def reporting(policy: str):
        count = 0

        def progress(n: int) -> None:
            nonlocal count
            count += n
            if count >= 200:
                ticks.put((policy, count))
                count = 0

        result = simulate(workload, policy, progress)
        ticks.put((policy, count))
        return result

    return [reporting(policy) for policy in policies]


def _print_table(workload: Workload, results) -> None:
    t = workload.timing
    title = (
        f"{workload.arrivals} foreground turns, {workload.slots} slots at {1 / t.decode_step_s:.0f} tok/s, "
        f"background {workload.background.dist} mean {workload.background.mean:.0f} tokens, seed {workload.seed}, "
        f"shaping {'on' if workload.shaping else 'off'}"
    )
    table = Table(title=title)
    for col in (
        "policy",
        "fg wait p50",
        "p99",
        "max",
        "ttft p50",
        "p99",
        "itl p50",
        "p99",
        "turn p50",
        "p99",
        "bg tok/s",
        "preempts",
        "resumes cost",
        "prompt reused",
    ):
        table.add_column(col, justify="right", no_wrap=True)
    for r in results:
        s = r.summary()
        w = s["fg_wait_s"]
        feel = [format_duration(s[key][p]) for key in ("fg_ttft_s", "fg_itl_s", "fg_turn_s") for p in ("p50", "p99")]
        cost = (
            f"{r.recomputed_tokens / 1e3:.0f}k tok"
            if r.recomputed_tokens
            else f"{s['swapped_mb'] / 1e3:.1f} GB"
            if r.swapped_bytes
            else "-"
        )
        table.add_row(
            r.policy,
            *(format_duration(w[k]) for k in ("p50", "p99", "max")),
            *feel,
            f"{s['bg_tok_per_s']:.1f}",
            str(s["preemptions"]),
            cost,
            f"{s['prompt_reused']:.0%}",
        )
    Console(width=max(Console().width, 170)).print(table)
