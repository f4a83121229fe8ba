"""`swarm tail`: watch a swarm's scheduling decisions, live or from a file."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

from rich.console import Console

from swarm.viewers import tail


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "tail",
        help="show a swarm's events, live or from an events file",
        description=(
            "Show a swarm's scheduling events (admissions, preemptions, resumes...). "
            "PATH is a JSON-lines events file or a running swarm's socket; without it, "
            "the newest running swarm is followed. A line that is not an event is an "
            "error naming its line number."
        ),
    )
    parser.add_argument("path", nargs="?", metavar="PATH", help="events file (.jsonl) or swarm socket")
    parser.add_argument("-f", "--follow", action="store_true", help="keep reading lines appended to the file (a socket always follows)")
    parser.add_argument("--agent", action="append", default=[], metavar="A", help="only events of (or caused by) agent A; repeatable")
    parser.add_argument(
        "--event",
        action="append",
        default=[],
        metavar="E",
        help="only events named E: a prefix (turn, kv.swap) or a glob (turn.*); repeatable",
    )
    parser.add_argument("--json", action="store_true", help="print the events as JSON lines, unchanged")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    kind, path = tail.resolve_source(args.path)
    if kind == "socket":
        lines = tail.read_socket(path)
        print(f"following the swarm at {path} (Ctrl-C to stop)", file=sys.stderr)
    else:
        lines = tail.read_file(path, follow=args.follow)
        if not args.follow:
            # A turn.queued is stamped with when its agent asked, before the boundary
            # that logged it: a finished file is shown in time order.
            lines = tail.in_time_order(lines)
    lines = tail.filtered(lines, tail.make_filter(args.agent, args.event))
    try:
        if args.json:
            _print_json(lines)
        else:
            _print_pretty(lines)
    except KeyboardInterrupt:
        return 130
    finally:  # (a closed pipe, `swarm tail | head`, is swarm.cli's to quiet)
        lines.close()
    if kind == "socket":
        print("the swarm stopped", file=sys.stderr)
    return 0


def _print_json(lines: Iterator[tail.Line]) -> None:
    out = sys.stdout.buffer
    for raw, _ in lines:
        out.write(raw if raw.endswith(b"\n") else raw + b"\n")
        out.flush()


def _print_pretty(lines: Iterator[tail.Line]) -> None:
    console = Console(highlight=False, soft_wrap=True)
    console.on_broken_pipe = _raise_broken_pipe  # rich would exit 1 itself; a closed pipe is no error here
    for _, item in lines:
        console.print(tail.render(item))


def _raise_broken_pipe() -> None:
    raise BrokenPipeError  # to swarm.cli, which quiets it
