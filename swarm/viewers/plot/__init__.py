"""Pictures of a swarm session: a slot timeline from an events file, or the
foreground-wait distribution per policy from bench results.

One module a picture: `timeline` and `bench`; this one tells an input file's kind
and hands it to the right one.

Only matplotlib's object API is used (no pyplot), so nothing needs a display and
no global backend is switched.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec

from runtime.errors import ConfigError
from runtime.events.kinds import Event
from swarm.viewers.plot.bench import plot_bench
from swarm.viewers.plot.timeline import Timeline, build_timeline, draw_timeline, foreground_answers, plot_timeline
from swarm.viewers.tail import read_file

__all__ = [
    "Timeline",
    "build_timeline",
    "draw_timeline",
    "foreground_answers",
    "load",
    "plot_bench",
    "plot_file",
    "plot_timeline",
]


# ---------------------------------------------------------------- input


def load(path: str | os.PathLike[str]) -> tuple[str, Any]:
    """("events", [Event, ...]) or ("bench", {...}), told apart by content."""
    name = os.fspath(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read: {exc.strerror}") from None
    if not data.strip():
        raise ConfigError(f"{name} is empty: nothing to plot")
    try:
        whole = msgspec.json.decode(data)
    except msgspec.DecodeError:
        whole = None  # several JSON lines (or not JSON at all: read_file says where)
    if isinstance(whole, dict) and "policies" in whole:
        return "bench", whole
    if whole is not None and not (isinstance(whole, dict) and "event" in whole):
        raise ConfigError(
            f"{name}: neither an events file (JSON lines with an 'event' field) nor bench results (an object with 'policies')"
        )
    events = [item for _, item in read_file(path) if isinstance(item, Event)]
    if not events:
        raise ConfigError(f"{name}: no events in it, nothing to plot")
    return "events", events


# ---------------------------------------------------------------- output


def plot_file(path: str | os.PathLike[str], out: str | os.PathLike[str] | None = None) -> Path:
    """Plot whatever `path` holds; the picture goes to `out` (default: next to
    the input, as .png). Returns where it went."""
    kind, data = load(path)
    out = Path(out) if out is not None else Path(path).with_suffix(".png")
    if kind == "bench":
        return plot_bench(data, out)
    return plot_timeline(data, out)
