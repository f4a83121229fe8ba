"""`swarm run --project PATH` (and `swarm run` alone, on the built-in sample
project): the coding team, from the command line to the report."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import anyio
from rich.console import Console

from runtime.errors import ConfigError
from runtime.events.stream import default_socket_path
from swarm.agent_loading import new_out_dir
from swarm.session import DEMO_SESSION, load_session
from swarm.viewers import tail

SAMPLE_PROJECT = Path(__file__).resolve().parent.parent.parent / "agents" / "sample_project"
DEFAULT_DURATION = 600.0
DEMO_QUESTIONS = ["What does inventory.py do?", "status", "Why does test_total_is_quantity_times_price fail?"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--project",
        metavar="PATH",
        help="a folder or git repository whose failing tests the team fixes, on a private copy (default: the built-in sample project)",
    )
    p.add_argument(
        "--test-cmd", metavar="CMD", help="the command that runs the project's tests (default: pytest, where the project has tests)"
    )
    p.add_argument("--apply", action="store_true", help="write the verified fixes into the project (refused on a dirty git tree)")
    p.add_argument(
        "--ask",
        action="append",
        metavar="QUESTION",
        help="a question for the planner, answered while the team works (repeatable; else the prompt, when stdin is a terminal)",
    )
    p.add_argument("--fixers", type=int, default=2, metavar="N", help="fixer agents (default 2)")
    p.add_argument("--candidates", type=int, default=4, metavar="N", help="candidate patches each fixer samples a round (default 4)")
    p.add_argument("--temperature", type=float, default=0.8, metavar="T", help="the fixers' sampling temperature (default 0.8)")
    p.add_argument(
        "--rounds", type=int, metavar="N", help="rounds of candidates per failure before a fixer gives up (default: until --duration)"
    )


def check(args: argparse.Namespace) -> None:
    if args.fixers < 1 or args.candidates < 1:
        raise ConfigError(f"--fixers and --candidates must be at least 1, got {args.fixers} and {args.candidates}")
    if args.rounds is not None and args.rounds < 1:
        raise ConfigError(f"--rounds must be at least 1, got {args.rounds}")
    if not 0 <= args.temperature < 10:
        raise ConfigError(f"--temperature must be in [0, 10), got {args.temperature}")


def run_team(args: argparse.Namespace) -> int:
    from swarm.coding.team import CodingTeam
    from swarm.runner import SessionRunner

    check(args)
    session = load_session(args.session) if args.session else load_session(DEMO_SESSION)
    if not args.session:
        session.agents = []
    project = Path(args.project) if args.project else SAMPLE_PROJECT
    session.workspace = str(project.resolve())
    for flag in ("model", "device", "kernels", "duration", "prefix_cache", "speculate"):
        if getattr(args, flag) is not None:
            setattr(session, flag, getattr(args, flag))
    if args.no_shaping:
        session.shaping = False
    if args.project and not args.session and args.duration is None:
        session.duration = DEFAULT_DURATION  # (the demo keeps its own, shorter cap)
    interactive = not args.ask and sys.stdin.isatty()
    script = args.ask
    if script is None and not interactive and not args.project:
        script = DEMO_QUESTIONS  # the demo's person, scripted
    console = Console(highlight=False, soft_wrap=True)
    logging.getLogger("runtime.actors.system").setLevel(logging.CRITICAL)
    say = lambda text: console.print(text, style="bold cyan", markup=False)  # noqa: E731
    out = new_out_dir(session)
    team = CodingTeam(
        project,
        out,
        test_cmd=args.test_cmd,
        fixers=args.fixers,
        candidates=args.candidates,
        temperature=args.temperature,
        rounds=args.rounds,
        script=script,
        interactive=interactive,
        interval_s=session.interval if script is DEMO_QUESTIONS else 0.0,
        say=say,
        worktree=args.project is not None,
    )
    socket = default_socket_path()
    quiet = args.quiet or interactive  # event lines would bury the prompt: `swarm tail` shows them
    runner = SessionRunner(
        session,
        out=out,
        socket=socket,
        on_event=None if quiet else (lambda e: console.print(tail.render(e))),
        say=say,
        cluster=args.cluster,
        owners=args.owners,
    )
    runner.agents = team.agents
    console.print(
        f"project: {team.copy.source}\ncopy:    {team.copy.copy}\ntests:   {team.runner.name} ({team.sandbox.kind} sandbox)\n"
        f"events:  {runner.events_path}\nlive:    swarm tail {socket}\nout:     {out}"
    )
    if interactive:
        console.print("Ask about the project at the prompt; `status` for the score, `quit` (or Ctrl-D) to end.")
    interrupted = False
    try:
        anyio.run(runner.run)
    except KeyboardInterrupt:
        interrupted = True
    print_swarm_summary(console, runner)
    try:
        report = team.finish(apply=args.apply, model=session.model or "")
    except ConfigError as exc:  # --apply refused: the report and patches are still written
        console.print(f"[bold red]{exc}[/]", markup=True)
        report = out / "report.md"
    console.print(f"report:  {report}\npatches: {out / 'patches'}")
    if team.applied:
        console.print(f"applied to {team.copy.source}: {', '.join(team.applied)}")
    return 130 if interrupted else 0


def print_swarm_summary(console: Console, runner) -> None:
    """What the person felt (foreground wait, TTFT, ITL against the idle engine), as `swarm run` prints it."""
    import statistics

    from runtime.events.kinds import read_events
    from swarm.commands.run import print_summary
    from swarm.summary import summarize

    events = list(read_events(runner.events_path)) if runner.events_path.exists() else []
    swarm = getattr(runner, "swarm", None)
    owner = getattr(swarm, "owner", None)
    overhead = statistics.median(owner.overhead_seconds) if owner is not None and owner.overhead_seconds else 0.0
    engine = runner.engine
    summary = summarize(
        events,
        runner.agents,
        engine.cost if engine is not None else None,
        getattr(getattr(swarm, "config", None), "prefill_chunk", 512),
        overhead,
    )
    print_summary(console, summary, runner)
