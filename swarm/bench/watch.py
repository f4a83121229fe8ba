"""`swarm bench watch`: do open pages slow the swarm down?

Runs the demo's agents on the real engine, with the page served in the swarm's
own process exactly as `swarm run --watch` serves it, and measures the decode
step time in rounds with no page open and with `--pages` pages open in a real
headless chromium (Debian's chromium and chromium-driver, driven by selenium),
interleaved A B B A ... so that drift on a shared machine falls on both sides.

A browser opens at most six connections to one host and port, so the page is
served on one port per six pages; every page is its own window, so every one of
them draws.

Each round measures the steady state: a browser that has just opened fifty
windows keeps both cores busy for 20-30 s and then takes tens of seconds more to
quieten (its start-up, not the pages' drawing: fifty settled pages took 6-10% of
a core on the quiet machine, 42% and 19% in the third and fourth ten seconds
after opening), so a round with pages starts only after SETTLE_MIN_S and once
the readers' CPU use over ten seconds has stopped falling and is near its lowest
yet (on a loaded machine the start-up is starved, so it plateaus before it ends:
hence the minimum and the lowest), and every
round reports what the readers used while it ran, and how often the pages drew
and what a frame cost them (from their own `swarmState.drawing`). The summary
is what matters: decode steps a second and the median step with pages open over
without, and the readers' share of a core.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import anyio

from runtime.errors import ConfigError
from runtime.scheduling.units import ceil_div
from swarm.runner import SessionRunner
from swarm.session import DEMO_SESSION, load_session
from swarm.viewers.watch import bind_loopback
from swarm.viewers.watch.browser import close_chromium, open_chromium

PAGES_PER_PORT = 6  # Chromium's limit on connections to one host and port
SETTLE_WINDOW_S = 10.0  # the readers' CPU use is compared over windows this long
SETTLE_MIN_S = 60.0
SETTLE_MAX_S = 240.0
QUESTIONS = [
    "What does a Python dataclass give me over a plain class?",
    "How do I read a JSON file safely in Python?",
    "What is the difference between a list and a tuple?",
    "review pricing.py",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pages", type=int, default=50, help="pages open in the B rounds (default 50)")
    parser.add_argument(
        "--readers",
        choices=("chromium", "raw"),
        default="chromium",
        help="chromium: real pages in a headless browser; raw: bare event-stream connections from another "
        "process (what the server alone costs, without the browser's drawing on the same CPU)",
    )
    parser.add_argument("--rounds", type=int, default=2, help="A B B A cycles (default 2)")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each round (default 20)")
    parser.add_argument("--model", metavar="PATH", help="GGUF file (default: the demo's model)")
    parser.add_argument("--device", metavar="D", help="OpenCL device (default: a GPU if any, else the first usable; env SWARM_DEVICE)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    if args.pages < 1 or args.rounds < 1 or args.seconds <= 0:
        raise ConfigError("--pages and --rounds must be at least 1, --seconds positive")
    session = load_session(DEMO_SESSION)
    session.model, session.device = args.model or session.model, args.device or session.device
    session.duration, session.turns, session.interval = None, None, 4.0
    session.script = QUESTIONS * 1000  # never runs out: the rounds end the run
    session.out = tempfile.mkdtemp(prefix="slotswarm-bench-watch-")
    ports = ceil_div(args.pages, PAGES_PER_PORT)
    runner = SessionRunner(session, page_sockets=[bind_loopback(0) for _ in range(ports)], say=lambda text: None)
    result = anyio.run(_bench, runner, args)
    shutil.rmtree(session.out, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
    else:
        _print(result)
    return 0


async def _bench(runner: SessionRunner, args: argparse.Namespace) -> dict[str, Any]:
    rounds: list[dict[str, Any]] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(runner.run)
        while getattr(runner, "swarm", None) is None or runner.swarm.owner.steps_run < 20:
            await anyio.sleep(0.2)  # the model loads, kernels compile, slots fill
        order = [0, args.pages, args.pages, 0] * args.rounds
        for pages in order:
            opened = await anyio.to_thread.run_sync(_OPEN[args.readers], runner.page_urls, pages) if pages else None
            try:
                while runner.hub.readers < pages:
                    await anyio.sleep(0.1)
                settled = await _settle(opened) if opened is not None else 0.0
                measured = await _measure(runner, pages, args.seconds, opened)
                if args.readers == "chromium" and opened is not None:
                    measured["drawing"] = await anyio.to_thread.run_sync(_drawing, opened)
                rounds.append({**measured, "settled_s": settled})
            finally:
                if opened is not None:
                    await anyio.to_thread.run_sync(_close, opened)
        tg.cancel_scope.cancel()
    by = {n: [s for r in rounds if r["pages"] == n for s in r["steps_s"]] for n in (0, args.pages)}
    rate = {n: statistics.fmean(r["steps_per_s"] for r in rounds if r["pages"] == n) for n in (0, args.pages)}
    median = {n: statistics.median(v) if v else None for n, v in by.items()}
    return {
        "pages": args.pages,
        "readers": args.readers,
        "seconds_per_round": args.seconds,
        "rounds": [{k: v for k, v in r.items() if k != "steps_s"} for r in rounds],
        "steps_per_s": {str(n): v for n, v in rate.items()},
        # What matters, with pages open over without: decode steps a second and the median step.
        "steps_per_s_ratio": rate[args.pages] / rate[0] if rate[0] else None,
        "step_s_median_ratio": median[args.pages] / median[0] if median[0] and median[args.pages] else None,
        "readers_cpu": statistics.fmean(r["readers_cpu"] for r in rounds if r["pages"] == args.pages),
        "step_s_median": {str(n): v for n, v in median.items()},
        "step_s_p90": {str(n): _p90(v) for n, v in by.items()},
        "step_s_mean": {str(n): statistics.fmean(v) if v else None for n, v in by.items()},
        "steps": {str(n): len(v) for n, v in by.items()},
    }


async def _settle(opened: Any) -> float:
    """Wait until the readers' CPU use stops falling (the browser's start-up is
    over); returns how long that took."""
    t0 = time.monotonic()
    rates: list[float] = []
    while time.monotonic() - t0 < SETTLE_MAX_S:
        before = _cpu_s(opened)
        await anyio.sleep(SETTLE_WINDOW_S)
        rates.append((_cpu_s(opened) - before) / SETTLE_WINDOW_S)
        # No longer falling, and near the lowest yet: the start-up keeps the cores
        # busy (a plateau that is not the end of it) and then decays over tens of seconds.
        settled = rates[-1] >= 0.8 * rates[-2] and rates[-1] <= 1.5 * min(rates) if len(rates) >= 2 else False
        if settled and time.monotonic() - t0 >= SETTLE_MIN_S:
            break
    return time.monotonic() - t0


def _cpu_s(opened: Any) -> float:
    """CPU seconds used so far by the readers' processes (the browser's whole tree)."""
    root = opened.pid if isinstance(opened, subprocess.Popen) else opened.service.process.pid
    parent: dict[int, int] = {}
    used: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        parent[int(entry)] = int(fields[1])
        used[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    total = 0.0
    for pid, cpu in used.items():
        p = pid
        while p > 1 and p != root:
            p = parent.get(p, 0)
        if p == root:
            total += cpu
    return total


async def _measure(runner: SessionRunner, pages: int, seconds: float, opened: Any) -> dict[str, Any]:
    owner = runner.swarm.owner
    before, events_before, t0 = owner.steps_run, runner.hub.published, time.monotonic()
    readers_before = _cpu_s(opened) if opened is not None else 0.0
    await anyio.sleep(seconds)
    n = owner.steps_run - before
    steps = list(owner.step_seconds)[-n:] if n else []
    elapsed = time.monotonic() - t0
    return {
        "pages": pages,
        "readers": runner.hub.readers,
        "steps": n,
        "steps_per_s": n / seconds,
        "step_s_median": statistics.median(steps) if steps else None,
        "step_s_p90": _p90(steps),
        "step_s_mean": statistics.fmean(steps) if steps else None,
        "events_per_s": (runner.hub.published - events_before) / elapsed,
        # The readers' share of one core while the round ran (the browser's whole tree).
        "readers_cpu": (_cpu_s(opened) - readers_before) / elapsed if opened is not None else 0.0,
        "steps_s": steps,
    }


def _drawing(chromium: Any) -> dict[str, Any]:
    """How the pages drew, as each says in `swarmState.drawing`: means over the
    pages of their frames' cost (ms of their main thread) and of the interval
    they drew at."""
    seen = []
    for handle in chromium.window_handles:
        chromium.switch_to.window(handle)
        seen.append(chromium.execute_script("return window.swarmState.drawing"))
    seen = [d for d in seen if d and d["frame_ms"] is not None]
    return {
        "pages": len(seen),
        "frame_ms": statistics.fmean(d["frame_ms"] for d in seen) if seen else None,
        "interval_ms": statistics.fmean(d["interval_ms"] for d in seen) if seen else None,
    }


def _p90(samples: list[float]) -> float | None:
    return statistics.quantiles(samples, n=10)[-1] if len(samples) >= 2 else None


def _open_pages(urls: list[str], pages: int) -> Any:
    chromium = open_chromium()
    for i in range(pages):
        if i:
            chromium.switch_to.new_window("window")
        chromium.get(urls[i // PAGES_PER_PORT])
    return chromium


# Bare readers: connect, ask for the stream, read whatever comes, forever.
_RAW_READERS = """
import selectors, socket, sys
from urllib.parse import urlsplit
sel = selectors.DefaultSelector()
for i in range(int(sys.argv[1])):
    url = urlsplit(sys.argv[2 + i % (len(sys.argv) - 2)])
    s = socket.create_connection((url.hostname, url.port))
    s.sendall(b"GET /watch/events HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\nAccept: text/event-stream\\r\\n\\r\\n")
    sel.register(s, selectors.EVENT_READ)
while True:
    for key, _ in sel.select():
        if not key.fileobj.recv(65536):
            sel.unregister(key.fileobj)
"""


def _open_raw(urls: list[str], pages: int) -> Any:
    by_port = [urls[i // PAGES_PER_PORT] for i in range(pages)]
    return subprocess.Popen([sys.executable, "-c", _RAW_READERS, str(pages), *by_port])


_OPEN = {"chromium": _open_pages, "raw": _open_raw}


def _close(opened: Any) -> None:
    if isinstance(opened, subprocess.Popen):
        opened.kill()
        opened.wait()
        return
    close_chromium(opened)


def _print(result: dict[str, Any]) -> None:
    print(f"decode step time with 0 and {result['pages']} pages open ({result['readers']}), rounds of {result['seconds_per_round']:.0f} s")
    for r in result["rounds"]:
        drew = r.get("drawing")
        print(
            f"  {r['pages']:>3} pages ({r['readers']} reading): {r['steps']:>5} steps, {r['steps_per_s']:.1f}/s, "
            f"median {_ms(r['step_s_median'])}, p90 {_ms(r['step_s_p90'])}, mean {_ms(r['step_s_mean'])}, "
            f"{r['events_per_s']:.0f} events/s, readers {r['readers_cpu']:.0%} of a core (settled after {r['settled_s']:.0f} s)"
            + (
                f"; pages drew every {drew['interval_ms'] / 1000:.1f} s, {drew['frame_ms']:.1f} ms a frame"
                if drew and drew["frame_ms"] is not None
                else ""
            )
        )
    for n in result["step_s_median"]:
        print(
            f"all rounds with {n:>3} pages: {result['steps'][n]} steps, {result['steps_per_s'][n]:.1f}/s, "
            f"median {_ms(result['step_s_median'][n])}, p90 {_ms(result['step_s_p90'][n])}, mean {_ms(result['step_s_mean'][n])}"
        )
    print(
        f"with {result['pages']} pages over without: steps/s x{_ratio(result['steps_per_s_ratio'])}, "
        f"median step x{_ratio(result['step_s_median_ratio'])}; the readers took {result['readers_cpu']:.0%} of a core"
    )


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"
