"""`swarm bench session`: what the person feels while the fixers work.

One fix task (tests/fixtasks/), and the planner, the foreground agent, asked
`--questions` questions about it, one after another, as a person would (a
pause, `--interval`, before each). Each question runs through the planner's
own path (its tools, runtime.agent's `use_tools`), so one question may be
several turns. Twice:

    solo    the planner alone: nothing else on the device
    busy    the same questions while `--fixers` fixers each sample `--candidates`
            patches a round at temperature, in the background, without end

Every planner turn's time to first token and gaps between tokens are taken from
its turn-end event (the owner computes them in runtime.events.latency, the one
place they are computed), and the bench prints p50/p99 of each for both runs
and the ratios busy / solo, against the targets of issue 25: TTFT p99 <= 2x
solo, inter-token latency p50 <= 1.3x solo. It also says how many of the busy
run's turns ended while the fixers were still at work (a fixer that solves the
task stops: pick a task the model finds hard, as the default is).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from runtime.errors import ConfigError

QUESTIONS = (
    "What does this project do?",
    "Which test fails, and why?",
    "Where is the bug?",
    "Which files are in the project?",
    "What does the function under test compute?",
    "How would you fix it?",
    "Could the fix break another test?",
    "Say the failing test's error in one sentence.",
    "Is the bug in one function or in two?",
    "What value should the failing test get?",
    "Which function should change first?",
    "What is left to do?",
)
TTFT_P99_BOUND = 2.0  # busy / solo, issue 25's targets (from issue 14)
ITL_P50_BOUND = 1.3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from swarm.bench import fix

    parser.add_argument(
        "--model", metavar="MODEL", default="qwen2.5-coder-0.5b", help="GGUF path or catalogue name (default qwen2.5-coder-0.5b)"
    )
    parser.add_argument("--device", metavar="D", help="OpenCL device")
    parser.add_argument("--kernels", choices=("auto", "cpu", "gpu"), default="auto", help="kernel family")
    parser.add_argument("--task", default="two_functions_price", help=f"one fix task under {fix.TASKS} (default two_functions_price)")
    parser.add_argument("--questions", type=int, default=10, metavar="N", help=f"questions asked (1-{len(QUESTIONS)}, default 10)")
    parser.add_argument("--interval", type=float, default=1.0, metavar="S", help="pause before each question, seconds (default 1)")
    parser.add_argument("--answer-tokens", type=int, default=96, metavar="N", help="most tokens a planner turn decodes (default 96)")
    parser.add_argument("--fixers", type=int, default=2, metavar="N", help="background fixers (default 2, as swarm run)")
    parser.add_argument("--candidates", type=int, default=4, metavar="N", help="candidates a fixer samples a round (default 4)")
    parser.add_argument("--slots", type=int, default=8, help="decode slots (default 8)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


@dataclass
class Felt:
    """What the planner's turns felt in one run."""

    ttft_s: list[float] = field(default_factory=list)  # one a turn
    itl_s: list[float] = field(default_factory=list)  # every gap between tokens, all turns
    turns: int = 0
    busy_turns: int = 0  # turns that ended while the fixers still worked
    answers: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        from runtime.scheduling.units import percentiles

        return {
            "turns": self.turns,
            "busy_turns": self.busy_turns,
            "ttft_s": percentiles(self.ttft_s),
            "itl_s": percentiles(self.itl_s),
        }


def run(args: argparse.Namespace) -> int:
    from gpu.engine import open_engine
    from swarm.bench.fix import task_names

    (task,) = task_names(args.task)
    if not 1 <= args.questions <= len(QUESTIONS):
        raise ConfigError(f"--questions must be 1-{len(QUESTIONS)}, got {args.questions}")
    if args.fixers < 1 or args.candidates < 1 or args.answer_tokens < 1 or args.interval < 0:
        raise ConfigError("--fixers, --candidates and --answer-tokens must be >= 1, --interval >= 0")
    engine = open_engine(args.model, args.device, kernels=args.kernels)
    report = measure(
        engine,
        task,
        QUESTIONS[: args.questions],
        fixers=args.fixers,
        candidates=args.candidates,
        slots=args.slots,
        interval_s=args.interval,
        answer_tokens=args.answer_tokens,
        say=None if args.json else (lambda line: print(line, flush=True)),
    )
    report["model"] = getattr(engine, "model_name", None) or args.model
    print(json.dumps(report) if args.json else format_report(report))
    return 0


def measure(
    engine,
    task: str,
    questions: Sequence[str],
    *,
    fixers: int = 2,
    candidates: int = 4,
    slots: int = 8,
    interval_s: float = 1.0,
    answer_tokens: int = 96,
    prefix_cache: bool = True,
    tasks: Path | None = None,
    say=None,
) -> dict:
    """The solo and busy runs (after one unmeasured question that warms the
    engine and compiles the planner's tool grammar), and the ratios."""
    from swarm.bench.fix import TASKS

    project = (tasks or TASKS) / task
    options = dict(slots=slots, interval_s=interval_s, answer_tokens=answer_tokens, prefix_cache=prefix_cache)
    anyio.run(lambda: ask(engine, project, questions[:1], background=0, candidates=candidates, **options))
    solo = anyio.run(lambda: ask(engine, project, questions, background=0, candidates=candidates, **options))
    busy = anyio.run(lambda: ask(engine, project, questions, background=fixers, candidates=candidates, **options))
    for name, felt in (("solo", solo), ("busy", busy)):
        if say is not None:
            for question, answer in zip(questions, felt.answers, strict=False):
                say(f"[{name}] {question} -> {answer[:100]!r}")
    report = {"task": task, "questions": len(questions), "fixers": fixers, "candidates": candidates, "slots": slots}
    report["solo"], report["busy"] = solo.summary(), busy.summary()
    report["ratios"] = ratios(report["solo"], report["busy"])
    return report


def ratios(solo: dict, busy: dict) -> dict:
    """busy / solo for the two figures with targets, and whether each is met."""
    out: dict = {}
    for key, figure, bound in (("ttft_p99", ("ttft_s", "p99"), TTFT_P99_BOUND), ("itl_p50", ("itl_s", "p50"), ITL_P50_BOUND)):
        a, b = solo[figure[0]], busy[figure[0]]
        ratio = b[figure[1]] / a[figure[1]] if a and b and a[figure[1]] > 0 else None
        out[key] = {"ratio": ratio, "bound": bound, "met": ratio is not None and ratio <= bound}
    return out


async def ask(
    engine,
    project: Path,
    questions: Sequence[str],
    *,
    background: int,
    candidates: int,
    slots: int,
    interval_s: float,
    answer_tokens: int,
    prefix_cache: bool,
) -> Felt:
    """One run: the planner answers `questions` (its answers kept), with
    `background` fixers at work the whole time (none: solo)."""
    from agents.coding import Failure
    from agents.fixer import Fixer
    from agents.planner import Planner
    from runtime.events.kinds import Admitted, Ended
    from runtime.events.latency import felt
    from swarm.api import Swarm
    from swarm.coding.project import ProjectCopy
    from swarm.coding.sandbox import Sandbox
    from swarm.coding.testing import detect_runner
    from swarm.coding.tools import Toolbox

    result = Felt()
    with tempfile.TemporaryDirectory(prefix=f"session-{project.name}-") as tmp:
        copy = ProjectCopy.create(project, Path(tmp), worktree=False)
        tools = Toolbox(copy, detect_runner(copy.copy), Sandbox(), Path(tmp) / "scratch")
        baseline = await tools.run_tests()
        failing = baseline.failing
        if not failing:
            raise ConfigError(f"fix task {project.name} has no failing test")
        failure = Failure(failing[0], "\n".join(baseline.messages.get(t, "")[-500:] for t in failing))
        # The planner gets no fixers of its own: its state reads the same in both runs,
        # so both ask with the same prompts. The bench runs the fixers itself.
        planner = Planner(
            "planner", tools=tools, fixers=(), script=list(questions), interval_s=interval_s, max_tokens=answer_tokens, say=lambda _: None
        )
        team = [Fixer(f"fixer-{i + 1}", tools=tools, candidates=candidates, rounds=None) for i in range(background)]
        background_ended: float | None = None
        async with Swarm(engine, slots=slots, prefix_cache=prefix_cache) as swarm:
            events = swarm.bus.subscribe(max_buffer=10_000_000)
            async with anyio.create_task_group() as group:

                async def fix(fixer: Fixer) -> None:
                    nonlocal background_ended
                    await fixer.solve(failure, targets=failing)
                    background_ended = swarm.bus.now()  # (solved: the background thins out from here)

                for fixer in team:
                    await swarm.spawn(fixer)
                    group.start_soon(fix, fixer)
                if team:  # the person starts asking once the background is decoding
                    async for event in events:
                        if isinstance(event, Admitted) and event.agent.startswith("fixer-"):
                            break
                await swarm.spawn(planner)
                while len(planner.answers) < len(questions):
                    await anyio.sleep(0.2)  # (a bench: polling the planner's progress is enough)
                group.cancel_scope.cancel()
            seen = events.take_ready()
            events.close()
        for event in seen:
            if isinstance(event, Ended) and event.agent == planner.name and event.ttft_s is not None:
                result.turns += 1
                result.ttft_s.append(event.ttft_s)
                result.itl_s += felt(0.0, event.token_s or []).gaps_s
                if team and (background_ended is None or event.t <= background_ended):
                    result.busy_turns += 1
        result.answers = [answer for _, answer in planner.answers]
    return result


def format_report(report: dict) -> str:
    from runtime.scheduling.units import format_duration

    lines = [
        f"model {report['model']}, task {report['task']}, {report['questions']} questions, "
        f"{report['fixers']} fixers x {report['candidates']} candidates, {report['slots']} slots"
    ]
    for name in ("solo", "busy"):
        run = report[name]
        ttft, itl = run["ttft_s"] or {}, run["itl_s"] or {}
        lines.append(
            f"{name:<5} {run['turns']:>3} planner turns ({run['busy_turns']} while the fixers worked)  "
            f"TTFT p50 {format_duration(ttft.get('p50'))} p99 {format_duration(ttft.get('p99'))}  "
            f"ITL p50 {format_duration(itl.get('p50'))} p99 {format_duration(itl.get('p99'))}"
        )
    for key, label in (("ttft_p99", "TTFT p99"), ("itl_p50", "ITL p50")):
        r = report["ratios"][key]
        shown = f"{r['ratio']:.2f}x" if r["ratio"] is not None else "-"
        lines.append(f"{label} busy/solo {shown} (target <= {r['bound']}x): {'met' if r['met'] else 'NOT met'}")
    return "\n".join(lines)
