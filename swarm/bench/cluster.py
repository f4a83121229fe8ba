"""`swarm bench swarm --cluster`: bench swarm's load over several GPU owners.

Each owner gets the single-owner load of `swarm bench swarm` (its slots kept
busy by closed-loop background agents, one foreground agent sending turns like a
person), pinned to it, so every owner's figures stand beside the others' and
the cluster's totals pool them. The JSON adds
`"owners": {name: {"policies": {policy: row}}}` with the same row fields.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from typing import Any

import anyio

from runtime.events.kinds import Admitted, Preempted, StepAbandoned
from swarm.bench.load import Background, Foreground, Stats, feel, row, streams
from swarm.cluster import ClusterSwarm, Pinned


def _cluster(args: argparse.Namespace, policy: str, owners: int, pins: dict[str, str]) -> ClusterSwarm:
    name, _, variant = policy.partition(":")
    return ClusterSwarm(
        owners,
        address=None if args.cluster == "local" else args.cluster,
        model=args.model,
        device=args.device,
        kernels=args.kernels,
        slots=args.slots,
        policy=name,
        step_tokens=args.step_tokens,
        shaping=not args.no_shaping and variant != "unshaped",
        slack=args.slack,
        abandon_steps=variant != "whole",
        placement=Pinned(owners=pins),
    )


def _pooled(parts: list[Stats]) -> Stats:
    total = Stats()
    for s in parts:
        total.fg_live_s = max(total.fg_live_s, s.fg_live_s)  # live on some owner: at least the longest
        total.bg_tokens += s.bg_tokens
        total.bg_tokens_idle += s.bg_tokens_idle
        total.bg_paused_s += s.bg_paused_s
        for key in ("fg_wait_s", "fg_late_s", "fg_ttft_s", "fg_itl_s", "fg_turn_s", "fg_tokens_s"):
            getattr(total, key).extend(getattr(s, key))
    return total


async def bench_policy(policy: str, args: argparse.Namespace) -> dict[str, Any]:
    """One policy on a fresh cluster: per-owner rows and the pooled row."""
    names = [f"gpu{i}" for i in range(args.owners)]
    stats = {name: Stats() for name in names}
    pins = {f"fg-{name}": name for name in names} | {f"bg-{name}-{j}": name for name in names for j in range(args.slots)}
    preempted: Counter[str] = Counter()
    abandoned: Counter[str] = Counter()
    async with _cluster(args, policy, args.owners, pins) as swarm, anyio.create_task_group() as tg:

        async def tally(sub: Any) -> None:
            async for event in sub:
                if isinstance(event, Preempted) and event.owner and stats[event.owner].measuring:
                    preempted[event.owner] += 1
                elif isinstance(event, StepAbandoned) and event.owner and stats[event.owner].measuring:
                    abandoned[event.owner] += 1

        tg.start_soon(tally, swarm.bus.subscribe(max_buffer=10**6))
        foreground = {}
        for i, name in enumerate(names):  # each owner its own draws, the same under every policy
            lengths, gaps, bg_prompts, fg_prompts = streams(argparse.Namespace(**{**vars(args), "seed": args.seed + i}))
            foreground[name] = Foreground(f"fg-{name}", gaps, fg_prompts, args.fg_tokens, stats[name])
            for j in range(args.slots):
                await swarm.spawn(Background(f"bg-{name}-{j}", lengths, bg_prompts, stats[name]))
        with anyio.move_on_after(args.warmup):
            while swarm.bus.counts[Admitted] < args.slots * args.owners:
                await anyio.sleep(0.05)
        before = {name: (await swarm.handles[name].steps.remote())[0] for name in names}
        started = time.monotonic()
        for name in names:
            stats[name].measuring = True
            await swarm.spawn(foreground[name])
        await anyio.sleep(args.seconds)
        for s in stats.values():
            s.measuring = False
        elapsed = time.monotonic() - started
        steps = {}
        for name in names:
            run, seconds = await swarm.handles[name].steps.remote()
            steps[name] = seconds[-(run - before[name]) :] if run > before[name] else []
        tg.cancel_scope.cancel()
    owners = {name: row(stats[name], elapsed, preempted[name], steps[name], abandoned[name]) for name in names}
    total = row(
        _pooled(list(stats.values())), elapsed, sum(preempted.values()), [x for s in steps.values() for x in s], sum(abandoned.values())
    )
    return {"total": total, "owners": owners}


async def bench_solo(turns: int, args: argparse.Namespace) -> dict[str, Any]:
    """The first owner's foreground turns, one after another, on an idle cluster."""
    _, _, _, fg_prompts = streams(args)
    stats = Stats()
    async with _cluster(args, "resident", 1, {}) as swarm:
        fg = await swarm.spawn(Foreground("fg", iter(lambda: 0.05, None), fg_prompts, args.fg_tokens, stats, turns=turns))
        await swarm.join(fg)
    return {**feel(stats), "fg_turns": len(stats.fg_turn_s)}


def run(args: argparse.Namespace, policies: list[str]) -> dict[str, Any]:
    """Every policy, then solo; the same JSON as bench swarm plus `owners`."""
    import sys

    from swarm.bench.load import vs_solo

    if args.owners < 1:
        from runtime.errors import ConfigError

        raise ConfigError(f"--owners must be at least 1, got {args.owners}")
    results = {}
    for policy in policies:
        if not args.json:
            print(f"{policy}: {args.seconds:.0f} s on {args.owners} owners ...", file=sys.stderr, flush=True)
        results[policy] = anyio.run(bench_policy, policy, args, backend="asyncio")
    turns = max(r["owners"]["gpu0"]["fg_turns"] for r in results.values()) or 1
    solo = anyio.run(bench_solo, turns, args, backend="asyncio")
    for r in results.values():
        for figures in (r["total"], *r["owners"].values()):
            figures["vs_solo"] = vs_solo(figures, solo)
    return {
        "policies": {policy: r["total"] for policy, r in results.items()},
        "solo": solo,
        "owners": {
            name: {"policies": {policy: r["owners"][name] for policy, r in results.items()}} for name in results[policies[0]]["owners"]
        },
    }
