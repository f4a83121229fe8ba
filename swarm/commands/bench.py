"""`swarm bench ...`: benchmarks.

swarm bench engine   what one decode step costs on this device (swarm/bench/engine.py)
swarm bench swarm    the whole swarm under load (swarm/bench/swarm.py)
swarm bench serve    the same load over HTTP through the openai client (swarm/bench/serve.py)
swarm bench watch    decode step time with and without pages open (swarm/bench/watch.py)
swarm bench owner    the owner's host work per step, zero-cost engine (swarm/bench/owner.py)
swarm bench fix      bug-fix tasks solved, fixer swarm vs single shot (swarm/bench/fix.py)
swarm bench session  the person's latency while the fixers work, vs solo (swarm/bench/session.py)
swarm bench spec     speculative decoding: the foreground's ITL off and on, drafts kept (swarm/bench/spec.py)
"""

from __future__ import annotations

import argparse
import json

from swarm.bench import fix as bench_fix
from swarm.bench import owner as bench_owner
from swarm.bench import serve as bench_serve
from swarm.bench import session as bench_session
from swarm.bench import spec as bench_spec
from swarm.bench import swarm as bench_swarm
from swarm.bench import watch as bench_watch


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench", help="benchmark the engine or the swarm")
    sub = parser.add_subparsers(dest="bench", required=True, metavar="WHAT")

    engine = sub.add_parser("engine", help="decode step time for 1-8 turns, prefill rate, bandwidth")
    engine.add_argument(
        "--model",
        metavar="MODEL",
        help="GGUF path, catalogue name (smollm2-135m, the default; qwen2.5-coder-0.5b; qwen2.5-coder-1.5b; gemma3-270m; "
        "see swarm models) or hf:OWNER/REPO/FILE; env SWARM_MODEL",
    )
    engine.add_argument(
        "--device",
        metavar="D",
        help='OpenCL device, "platform:device" index or name part (default: a GPU if any, else the first usable; env SWARM_DEVICE)',
    )
    engine.add_argument(
        "--kernels", choices=("auto", "cpu", "gpu"), default="auto", help="kernel family: auto (shaped for the device), cpu or gpu"
    )
    engine.add_argument("--profile", action="store_true", help="per-kernel device time from OpenCL profiling events")
    engine.add_argument("--steps", type=int, default=16, metavar="N", help="timed decode steps per batch size")
    engine.add_argument(
        "--quants", action="store_true", help="instead: each tensor type's matmul time per weight byte against Q4_1's, at the model's shape"
    )
    engine.add_argument(
        "--constrained",
        action="store_true",
        help="instead: inter-token latency of 8 turns held to a JSON schema against 8 free ones, and the masks' host time",
    )
    engine.add_argument(
        "--validity",
        type=int,
        metavar="N",
        help="instead: N JSON-schema generations (several schemas, greedy and sampled): how many parse and validate",
    )
    engine.add_argument("--json", action="store_true", help="print one JSON object")
    engine.set_defaults(bench_run=run_engine)

    for name, module, text in (
        ("swarm", bench_swarm, "foreground wait per policy on the real engine, under background load"),
        ("serve", bench_serve, "the same load over HTTP: 8 background streams and a foreground client through the openai client"),
        ("owner", bench_owner, "the GPU owner's host time per step, with an engine that costs nothing"),
        ("watch", bench_watch, "decode step time with no page open and with many (a real headless chromium)"),
        ("fix", bench_fix, "bug-fix tasks solved (tests/fixtasks): the fixer swarm against one greedy shot"),
        ("session", bench_session, "the foreground agent's TTFT and inter-token latency while the fixers work, against solo"),
        ("spec", bench_spec, "speculative decoding: the foreground turn's inter-token latency off and on, drafts kept, tokens a step"),
    ):
        bench = sub.add_parser(name, help=text)
        module.add_arguments(bench)
        bench.set_defaults(bench_run=module.run)

    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return args.bench_run(args) or 0


def run_engine(args: argparse.Namespace) -> int:
    from gpu.engine import open_engine
    from runtime.errors import ConfigError
    from swarm.bench.engine import format_report, kv_blocks_needed, run_engine_bench

    if args.steps < 1:
        raise ConfigError(f"--steps must be at least 1, got {args.steps}")
    if args.quants:
        from gpu.model.fetch import resolve_model
        from gpu.model.load import load_model
        from swarm.bench.quants import format_quant_report, run_quant_bench

        config = load_model(resolve_model(args.model)).config
        report = run_quant_bench(config, device=args.device, kernels=args.kernels, steps=args.steps)
        print(json.dumps(report) if args.json else format_quant_report(report))
        return 0
    if args.constrained or args.validity:
        from swarm.bench import constrained as bc

        if args.validity is not None and args.validity < 1:
            raise ConfigError(f"--validity must be at least 1, got {args.validity}")
        steps = args.steps if args.steps != 16 else 64  # (a longer default: masks vary along an answer)
        engine = open_engine(args.model, args.device, kernels=args.kernels, num_blocks=max(bc.blocks_needed(steps), 8 * 32))
        if args.constrained:
            report = bc.run_constrained_bench(engine, steps=steps)
            print(json.dumps(report) if args.json else bc.format_constrained(report))
        if args.validity:
            report = bc.run_validity(engine, generations=args.validity)
            print(json.dumps(report) if args.json else bc.format_validity(report))
        return 0
    engine = open_engine(
        args.model,
        args.device,
        kernels=args.kernels,
        profile=args.profile,
        num_blocks=kv_blocks_needed(args.steps),
    )
    report = run_engine_bench(engine, steps=args.steps)
    print(json.dumps(report) if args.json else format_report(report))
    return 0
