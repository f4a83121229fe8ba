"""`swarm bench serve`: `bench swarm`'s load, driven over HTTP through the `openai` client.

A real `swarm serve` process (loopback, a free port) gets 8 closed-loop
background streams and one foreground client: the same prompts, lengths and
gaps as `bench swarm` draws for the same seed (token-id prompts on
/v1/completions, `ignore_eos` so the lengths hold). The clients run in this
process, on one event loop, as an agent framework's would.

Reported: the foreground's time to first token and inter-token latency as the
client sees them (request sent to first text; between texts), p50/p90/p99/max,
next to the server's own `ttft_s` from the usage (so the HTTP share shows), and
background tokens/s. Unless --no-compare, `bench swarm`'s resident policy then
runs in this process on the same workload, and the TTFT p99 ratio is reported
(the target: at most 2x).
"""

from __future__ import annotations

import argparse
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from runtime.errors import ConfigError
from runtime.scheduling.turns import Policy
from runtime.scheduling.units import format_duration, percentiles
from swarm.bench import load as bench_load
from swarm.bench import swarm as bench_swarm

START_TIMEOUT_S = 600


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=60.0, help="measured seconds (after the warm-up)")
    parser.add_argument("--json", action="store_true", help="print one JSON object (with raw samples)")
    parser.add_argument("--policy", default=Policy.RESIDENT.value, help="the server's policy: " + ", ".join(p.value for p in Policy))
    parser.add_argument("--slots", type=int, default=8, help="slots, and background streams")
    parser.add_argument("--model", help="GGUF model file (default: the default model)")
    parser.add_argument("--device", help="OpenCL device (default: a GPU if any, else the first usable; env SWARM_DEVICE)")
    parser.add_argument(
        "--kernels", choices=("auto", "cpu", "gpu"), default="auto", help="kernel family: auto (shaped for the device), cpu or gpu"
    )
    parser.add_argument("--fg-interval", type=float, default=5.0, help="mean seconds between foreground turns")
    parser.add_argument("--fg-tokens", type=int, default=48, help="tokens per foreground turn")
    parser.add_argument("--bg-max", type=int, default=256, help="clip background turn lengths")
    parser.add_argument("--step-tokens", type=int, default=16, help="tokens one step may process")
    parser.add_argument("--prompt", type=int, default=300, help="mean prompt tokens per turn")
    parser.add_argument("--warmup", type=float, default=60.0, help="at most this many seconds for every stream to start first")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the load")
    parser.add_argument("--no-compare", action="store_true", help="skip the in-process `bench swarm` run")


@dataclass
class Stats:
    measuring: bool = False
    started: int = 0  # background streams that have had a first token
    bg_tokens: int = 0
    fg_ttft_s: list[float] = field(default_factory=list)  # client side
    fg_itl_s: list[float] = field(default_factory=list)
    fg_server_ttft_s: list[float] = field(default_factory=list)  # usage.ttft_s
    fg_waited_s: list[float] = field(default_factory=list)
    fg_preemptions: int = 0
    errors: list[str] = field(default_factory=list)


async def drive(url: str, model: str, args: argparse.Namespace) -> dict[str, Any]:
    import openai

    lengths, gaps, bg_prompts, fg_prompts = bench_load.streams(args)
    stats = Stats()

    async def background(client: openai.AsyncOpenAI, i: int) -> None:
        first = True
        while True:
            stream = await client.completions.create(
                model=model,
                prompt=next(bg_prompts),
                max_tokens=next(lengths),
                temperature=0,
                stream=True,
                stream_options={"include_usage": True, "continuous_usage_stats": True},
                extra_body={"ignore_eos": True},
                extra_headers={"X-Swarm-Agent": f"bg{i}"},
            )
            seen = 0
            async with stream:
                async for chunk in stream:
                    if chunk.usage is not None:
                        n = chunk.usage.completion_tokens
                        stats.bg_tokens += (n - seen) * stats.measuring
                        seen = n
                        if first and n:
                            first, stats.started = False, stats.started + 1

    async def foreground(client: openai.AsyncOpenAI) -> None:
        while True:
            await anyio.sleep(next(gaps))
            sent = time.monotonic()
            times: list[float] = []
            usage: dict[str, Any] = {}
            stream = await client.completions.create(
                model=model,
                prompt=next(fg_prompts),
                max_tokens=args.fg_tokens,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
                extra_headers={"X-Swarm-Agent": "fg", "X-Swarm-Priority": "foreground"},
            )
            async with stream:
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].text:
                        times.append(time.monotonic())
                    if chunk.usage is not None:
                        usage = chunk.usage.model_dump()
            if not stats.measuring or not times:
                continue
            stats.fg_ttft_s.append(times[0] - sent)
            stats.fg_itl_s += [b - a for a, b in zip(times, times[1:], strict=False)]
            if usage.get("ttft_s") is not None:
                stats.fg_server_ttft_s.append(usage["ttft_s"])
                stats.fg_waited_s.append(usage["waited_s"])
            stats.fg_preemptions += usage.get("preemptions", 0)

    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="-", max_retries=0, timeout=3600) as client:
        async with anyio.create_task_group() as tg:
            for i in range(args.slots):
                tg.start_soon(background, client, i)
            with anyio.move_on_after(args.warmup):
                while stats.started < args.slots:
                    await anyio.sleep(0.05)
            stats.measuring = True
            started = time.monotonic()
            tg.start_soon(foreground, client)
            await anyio.sleep(args.seconds)
            stats.measuring = False
            elapsed = time.monotonic() - started
            tg.cancel_scope.cancel()  # hang up: the server cancels every turn
    return {
        "fg_ttft_s": percentiles(stats.fg_ttft_s),
        "fg_itl_s": percentiles(stats.fg_itl_s),
        "fg_server_ttft_s": percentiles(stats.fg_server_ttft_s),
        "fg_wait_s": percentiles(stats.fg_waited_s),
        "fg_turns": len(stats.fg_ttft_s),
        "bg_streams_started": stats.started,
        "bg_tok_per_s": stats.bg_tokens / elapsed,
        "seconds": elapsed,
        "fg_ttft_samples_s": stats.fg_ttft_s,
        "fg_server_ttft_samples_s": stats.fg_server_ttft_s,
    }


class _Server:
    """`swarm serve` in a child process on a free loopback port."""

    def __init__(self, args: argparse.Namespace, model_id: str) -> None:
        cmd = [
            sys.executable,
            "-m",
            "swarm.cli",
            "serve",
            "--port",
            "0",
            "--served-model-name",
            model_id,
            "--slots",
            str(args.slots),
            "--policy",
            args.policy,
            "--step-tokens",
            str(args.step_tokens),
            "--kernels",
            args.kernels,
        ]
        cmd += ["--model", args.model] if args.model else []
        cmd += ["--device", args.device] if args.device else []
        # The child runs this very code, wherever it was imported from.
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)

    def url(self) -> str:
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            line = self.proc.stdout.readline() if sel.select(START_TIMEOUT_S) else ""
        match = re.search(r"http://[0-9.]+:\d+", line)
        if not match:
            self.stop()
            raise ConfigError(f"swarm serve did not start: {line!r}")
        return match.group(0)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def run(args: argparse.Namespace) -> int:
    for flag in ("seconds", "fg_interval", "prompt", "fg_tokens", "slots"):
        if getattr(args, flag) <= 0:
            raise ConfigError(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    Policy.parse(args.policy)
    model_id = "bench"
    if not args.json:
        print(f"over HTTP: {args.slots} background streams and a foreground client, {args.seconds:.0f} s ...", file=sys.stderr, flush=True)
    server = _Server(args, model_id)
    try:
        http = anyio.run(drive, server.url(), model_id, args)
    finally:
        server.stop()
    out: dict[str, Any] = {"workload": _workload(args), "http": http}
    if not args.no_compare:
        if not args.json:
            print(f"in process (bench swarm, {args.policy}): {args.seconds:.0f} s ...", file=sys.stderr, flush=True)
        local = _in_process(args)
        out["in_process"] = {k: local[k] for k in ("fg_ttft_s", "fg_itl_s", "fg_wait_s", "fg_turns", "bg_tok_per_s", "seconds")}
        mine, theirs = http["fg_ttft_s"], local["fg_ttft_s"]
        out["fg_ttft_p99_vs_in_process"] = mine["p99"] / theirs["p99"] if mine and theirs and theirs["p99"] > 0 else None
    return bench_swarm.report(out, args.json, print_table)


def _in_process(args: argparse.Namespace) -> dict[str, Any]:
    ns = argparse.Namespace(**vars(args), no_shaping=False, slack=0.25)
    from gpu.engine import open_engine

    engine = open_engine(args.model, args.device, kernels=args.kernels)
    return anyio.run(bench_swarm.bench_policy, engine, args.policy, ns)


def _workload(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("policy", "slots", "seconds", "fg_interval", "fg_tokens", "bg_max", "step_tokens", "prompt", "seed")
    return {k: getattr(args, k) for k in keys}


def print_table(out: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    w = out["workload"]
    table = Table(title=f"{w['slots']} background streams + 1 foreground client, {w['policy']}, {w['seconds']:.0f} s")
    for col in ("", "fg turns", "ttft p50", "p90", "p99", "max", "itl p50", "p90", "p99", "max", "bg tok/s"):
        table.add_column(col, justify="right")
    rows = [("over HTTP", out["http"])] + ([("in process", out["in_process"])] if "in_process" in out else [])
    for name, r in rows:
        ttft, itl = r["fg_ttft_s"] or {}, r["fg_itl_s"] or {}
        table.add_row(
            name,
            str(r["fg_turns"]),
            *(format_duration(ttft.get(k), 0) for k in ("p50", "p90", "p99", "max")),
            *(format_duration(itl.get(k), 0) for k in ("p50", "p90", "p99", "max")),
            f"{r['bg_tok_per_s']:.1f}",
        )
    console = Console()
    console.print(table)
    server = out["http"]["fg_server_ttft_s"]
    if server:
        console.print(
            f"server-side ttft (usage.ttft_s) over HTTP: p50 {format_duration(server['p50'], 0)}, p99 {format_duration(server['p99'], 0)}"
        )
    if out.get("fg_ttft_p99_vs_in_process") is not None:
        console.print(f"foreground ttft p99, HTTP / in process: {out['fg_ttft_p99_vs_in_process']:.2f}x (target <= 2x)")
