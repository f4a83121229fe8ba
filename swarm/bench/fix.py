"""`swarm bench fix`: how many small bug-fix tasks a model solves, as the swarm's
fixers do it and as a single shot.

Each task is a tiny project under tests/fixtasks/ with failing tests (an
off-by-one, a wrong operator, a missing case, a wrong return, bugs spanning two
functions). A task is solved when a patch makes every failing test pass and
breaks none, verified by running the tests in the sandbox. Per task: solved or
not, wall time, candidates tried, tokens decoded.

    swarm   the fixer: `--candidates` samples a round at `--temperature`, each
            round told what the best of the last one did, until solved or
            `--task-timeout`
    single  the baseline: one greedy candidate, no feedback
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import anyio

from runtime.errors import ConfigError

TASKS = Path(__file__).resolve().parents[2] / "tests" / "fixtasks"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", metavar="MODEL", default="qwen2.5-coder-0.5b", help="GGUF path or catalogue name (default qwen2.5-coder-0.5b)"
    )
    parser.add_argument("--device", metavar="D", help="OpenCL device")
    parser.add_argument("--kernels", choices=("auto", "cpu", "gpu"), default="auto", help="kernel family")
    parser.add_argument("--tasks", metavar="NAMES", help=f"comma-separated task names (default: all under {TASKS})")
    parser.add_argument(
        "--mode", choices=("swarm", "single", "both"), default="both", help="the fixer swarm, the single-shot baseline, or both"
    )
    parser.add_argument("--candidates", type=int, default=4, metavar="N", help="candidates a round in swarm mode (default 4)")
    parser.add_argument("--temperature", type=float, default=0.8, metavar="T", help="sampling temperature in swarm mode (default 0.8)")
    parser.add_argument("--task-timeout", type=float, default=600.0, metavar="S", help="seconds per task in swarm mode (default 600)")
    parser.add_argument("--slots", type=int, default=8, help="decode slots (default 8)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def task_names(spec: str | None) -> list[str]:
    every = sorted(p.name for p in TASKS.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
    if spec is None:
        return every
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in every]
    if unknown:
        raise ConfigError(f"no fix task {', '.join(unknown)}; the tasks are: {', '.join(every)}")
    return names


def run(args: argparse.Namespace) -> int:
    from gpu.engine import open_engine

    names = task_names(args.tasks)
    if args.candidates < 1 or args.task_timeout <= 0:
        raise ConfigError("--candidates must be >= 1 and --task-timeout > 0")
    modes = ["single", "swarm"] if args.mode == "both" else [args.mode]
    engine = open_engine(args.model, args.device, kernels=args.kernels)
    rows = []
    for mode in modes:
        for name in names:
            row = anyio.run(solve_task, engine, name, mode, args)
            rows.append(row)
            if not args.json:
                print(format_row(row), flush=True)
    report = {
        "model": getattr(engine, "model_name", None) or args.model,
        "rows": rows,
        "solved": {
            mode: f"{sum(r['solved'] for r in rows if r['mode'] == mode)}/{sum(1 for r in rows if r['mode'] == mode)}" for mode in modes
        },
    }
    print(json.dumps(report) if args.json else "solved: " + ", ".join(f"{m} {s}" for m, s in report["solved"].items()))
    return 0


async def solve_task(engine, name: str, mode: str, args: argparse.Namespace) -> dict:
    from agents.coding import Failure
    from agents.fixer import Fixer
    from swarm.api import Swarm
    from swarm.coding.project import ProjectCopy
    from swarm.coding.sandbox import Sandbox
    from swarm.coding.testing import detect_runner
    from swarm.coding.tools import Toolbox

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"fixtask-{name}-") as tmp:
        copy = ProjectCopy.create(TASKS / name, Path(tmp), worktree=False)
        tools = Toolbox(copy, detect_runner(copy.copy), Sandbox(), Path(tmp) / "scratch")
        baseline = await tools.run_tests()
        failing = baseline.failing
        message = "\n".join(f"{t}:\n{baseline.messages.get(t, '')[-500:]}" for t in failing)
        single = mode == "single"
        fixer = Fixer(
            "fixer",
            tools=tools,
            candidates=1 if single else args.candidates,
            temperature=0.0 if single else args.temperature,
            rounds=1 if single else None,
            max_tokens=320,
        )
        result = None
        async with Swarm(engine, slots=args.slots) as swarm:
            await swarm.spawn(fixer)
            with anyio.move_on_after(None if single else args.task_timeout):
                result = await fixer.solve(Failure(failing[0] if failing else "", message), targets=failing)
        tokens = sum(r.tokens for r in fixer.records)
        return {
            "task": name,
            "mode": mode,
            "solved": bool(result and result.verified),
            "seconds": round(time.monotonic() - started, 1),
            "candidates": len(fixer.records),
            "tokens": tokens,
            "rounds": result.rounds if result else None,
            "failing_before": len(failing),
            "diff": result.diff if result and result.verified else "",
        }


def format_row(row: dict) -> str:
    return (
        f"{row['mode']:<6} {row['task']:<26} {'solved' if row['solved'] else 'not solved':<10} {row['seconds']:>7.1f} s  "
        f"{row['candidates']:>3} candidates  {row['tokens']:>6} tokens"
    )
