"""`swarm run [session.toml]`: run a swarm of agents from a session file.

With --project PATH (or without a file, on the built-in sample project) it runs
the coding team: fixers find patches for the project's failing tests, verified in
a sandbox on a private copy, while the planner answers your questions.
"""

from __future__ import annotations

import argparse
import logging
import statistics

import anyio
from rich.console import Console
from rich.table import Table

from runtime.events.kinds import read_events
from runtime.events.stream import default_socket_path
from runtime.scheduling.turns import SchedulerConfig
from runtime.scheduling.units import format_duration, percentiles
from swarm.api import Swarm
from swarm.coding import command as coding
from swarm.runner import SessionRunner
from swarm.session import DEMO_SESSION, load_session
from swarm.summary import Summary, summarize
from swarm.viewers import tail
from swarm.viewers.watch import DEFAULT_PORT, bind_loopback


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("run", help="run a swarm from a session file (or the built-in demo)", description=__doc__)
    p.add_argument("session", nargs="?", help="session TOML file (default: the coding team on the built-in sample project)")
    p.add_argument(
        "--model",
        help="GGUF path, catalogue name (smollm2-135m, the default; qwen2.5-coder-0.5b; qwen2.5-coder-1.5b; gemma3-270m; "
        "see swarm models) or hf:OWNER/REPO/FILE (overrides the session's; env SWARM_MODEL below it)",
    )
    p.add_argument("--device", help="OpenCL device (overrides the session's; env SWARM_DEVICE below it)")
    p.add_argument(
        "--kernels",
        choices=("auto", "cpu", "gpu"),
        help="kernel family: auto (shaped for the device), cpu or gpu" + " (overrides the session's)",
    )
    p.add_argument("--duration", type=float, help="stop after this many seconds (overrides the session's)")
    p.add_argument("--quiet", action="store_true", help="no live event lines")
    p.add_argument("--no-shaping", action="store_true", help="turn step shaping for the foreground off (to compare)")
    p.add_argument(
        "--speculate",
        metavar="{off,lookup,draft[:MODEL]}",
        help="speculative decoding for the foreground turn (and a turn running alone) where the step cost law says it pays: "
        "lookup drafts by prompt lookup, "
        "draft by a draft model with the same tokenizer (draft:MODEL names it) (overrides the session's; default off)",
    )
    p.add_argument("--watch", action="store_true", help="also show the swarm live in the browser (see swarm watch)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"the page's port on 127.0.0.1 with --watch (default {DEFAULT_PORT})")
    p.add_argument(
        "--no-prefix-cache",
        dest="prefix_cache",
        action="store_false",
        default=None,
        help="compute every prompt in full (to measure what the prefix cache saves)",
    )
    p.add_argument(
        "--cluster",
        nargs="?",
        const="local",
        metavar="ADDRESS",
        help="run the GPU owners as Ray actors: a local Ray instance, or the cluster at ADDRESS (needs the cluster extra)",
    )
    p.add_argument("--owners", type=int, default=2, help="GPU owners with --cluster (default 2; one per GPU where the cluster has GPUs)")
    coding.add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.project or not args.session:
        return coding.run_team(args)
    session = load_session(args.session or DEMO_SESSION)
    for flag in ("model", "device", "kernels", "duration", "prefix_cache", "speculate"):
        if getattr(args, flag) is not None:
            setattr(session, flag, getattr(args, flag))
    if args.no_shaping:
        session.shaping = False
    console = Console(highlight=False, soft_wrap=True)
    # Agent crashes are reported as events and in the summary; keep tracebacks off the screen.
    logging.getLogger("runtime.actors.system").setLevel(logging.CRITICAL)
    socket = default_socket_path()
    runner = SessionRunner(
        session,
        socket=socket,
        on_event=None if args.quiet else (lambda e: console.print(tail.render(e))),
        say=lambda text: console.print(text, style="bold cyan", markup=False),
        page_sockets=[bind_loopback(args.port)] if args.watch else [],
        cluster=args.cluster,
        owners=args.owners,
    )
    console.print(f"events: {runner.events_path}\nlive:   swarm tail {socket}\nout:    {runner.out}")
    if runner.page_urls:
        console.print(f"page:   {runner.page_urls[0]}")
    if not args.session:
        console.print("demo: the built-in agents on the sample project (Ctrl-C stops it early)")
    interrupted = False
    try:
        anyio.run(runner.run)
    except KeyboardInterrupt:
        interrupted = True
    events = list(read_events(runner.events_path)) if runner.events_path.exists() else []
    engine = runner.engine
    # (A cluster's owners are Ray actors: their own figures are not at hand here.)
    local = runner.swarm if isinstance(runner.swarm, Swarm) else None
    overhead = statistics.median(local.owner.overhead_seconds) if local is not None and local.owner.overhead_seconds else 0.0
    prefill_chunk = (local.config if local is not None else SchedulerConfig()).prefill_chunk
    summary = summarize(events, runner.agents, engine.cost if engine is not None else None, prefill_chunk, overhead)
    print_summary(console, summary, runner)
    if interrupted:
        console.print("stopped by Ctrl-C")
    return 130 if interrupted else 0


def print_summary(console: Console, s: Summary, runner: SessionRunner) -> None:
    table = Table(title=f"{s.seconds:.1f} s, {s.steps} decode steps, {s.preemptions} preemptions, {s.inheritances} inheritances")
    for col in ("agent", "turns", "tokens", "paused", "preempted", "inherited", "crashed"):
        table.add_column(col, justify="left" if col in ("agent", "crashed") else "right")
    for name, a in s.agents.items():
        table.add_row(name, str(a.turns), str(a.tokens), f"{a.paused_s:.1f} s", str(a.preempted), str(a.inherited), a.crashed or "")
    console.print(table)
    waits = Table(
        title="foreground (turns at foreground priority); "
        "idle: the same turns alone (with the same prefix cache hits), by the engine's step cost law plus the owner's median time per step"
    )
    for col in ("", "n", "p50", "p90", "p99", "max", "idle p50", "x idle"):
        waits.add_column(col, justify="right")
    rows = (
        ("wait (request to slot)", s.fg_wait_s, []),
        ("time to first token", s.fg_ttft_s, s.idle_ttft_s),
        ("inter-token latency", s.fg_itl_s, s.idle_itl_s),
        ("turn time (request to last token)", s.fg_turn_s, s.idle_turn_s),
    )
    for label, samples, idle in rows:
        p, q = percentiles(samples), percentiles(idle)
        cells = [format_duration(p[k], 0) for k in ("p50", "p90", "p99", "max")] if p else ["-"] * 4
        cells += [format_duration(q["p50"], 0), f"{p['p50'] / q['p50']:.1f}x"] if p and q and q["p50"] > 0 else ["-", "-"]
        waits.add_row(label, str(len(samples)), *cells)
    console.print(waits)
    total = s.prompt_computed + s.prompt_reused
    if total:
        console.print(
            f"prompt tokens: {s.prompt_computed:,} computed, "
            f"{s.prompt_reused:,} reused from the prefix cache ({s.prompt_reused / total:.0%})"
        )
    if isinstance(runner.swarm, Swarm) and runner.swarm.owner.step_seconds:
        console.print(f"median decode step: {format_duration(statistics.median(runner.swarm.owner.step_seconds), 0)}")
    console.print(f"events: {runner.events_path}\nproposals: {runner.out}")
