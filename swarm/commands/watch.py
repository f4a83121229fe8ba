"""`swarm watch [SOCKET | EVENTS.jsonl]`: the swarm in a browser, on loopback."""

from __future__ import annotations

import argparse
import os
import socket
import stat
import sys
from pathlib import Path

import anyio

from runtime.errors import ConfigError
from swarm.viewers.watch import DEFAULT_PORT, WatchHub, bind_loopback, create_app, follow_socket, load_file, serve_http


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "watch",
        help="watch a swarm in the browser: live from its socket, or replay an events file",
        description=(
            "Serve a page on http://127.0.0.1:PORT/ showing the swarm slot by slot: turns per slot, "
            "pauses and resumes, priority inheritance, the agents and foreground latency. "
            "PATH is a running swarm's socket (followed, and waited for if it is not there yet) or an "
            "events file (replayed in the page, with play/pause and speed). Without PATH, the newest "
            "running swarm is followed, and the next one after it stops."
        ),
    )
    parser.add_argument("path", nargs="?", metavar="PATH", help="swarm socket or events file (.jsonl)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port on 127.0.0.1 (default {DEFAULT_PORT}; 0: any)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    kind = _kind(args.path)
    hub = WatchHub(mode="replay" if kind == "file" else "live", source=args.path or "the newest swarm")
    if kind == "file":
        load_file(hub, args.path)  # a bad line is an error now, not a broken page later
    sock = bind_loopback(args.port)
    try:
        anyio.run(_serve, hub, kind, args.path, sock)
    except KeyboardInterrupt:
        return 130
    return 0


async def _serve(hub: WatchHub, kind: str, path: str | None, sock: socket.socket) -> None:
    port = sock.getsockname()[1]
    async with anyio.create_task_group() as tg:
        tg.start_soon(serve_http, create_app(hub), sock)
        what = f"replaying {path}" if kind == "file" else f"following {path or 'the newest swarm'}"
        print(f"{what} on http://127.0.0.1:{port}/ (Ctrl-C to stop)", file=sys.stderr, flush=True)
        if kind == "socket":
            tg.start_soon(follow_socket, hub, path)


def _kind(path: str | None) -> str:
    """ "socket" or "file". A path that does not exist yet is a socket to wait for."""
    if path is None:
        return "socket"
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if Path(path).suffix == ".sock":
            return "socket"
        raise ConfigError(f"{path}: no such events file (a socket to wait for must end in .sock)") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISDIR(mode):
        raise ConfigError(f"{path} is a directory; pass an events file (.jsonl) or a swarm socket")
    return "file"
