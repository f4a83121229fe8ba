"""Reading and showing event streams: a JSON-lines file (optionally followed as it
grows, like `tail -f`) or a running swarm's live socket.

Every source yields `(raw, item)` pairs: the line exactly as read, and its
decoded form (an `Event`, or `Dropped` for a viewer's lost-events notice), so
`--json` can pass lines through byte for byte, fields unknown to this version
included.

A line that is not an event is an error naming the file and line number: a
half-written or foreign file should be noticed, not silently thinned out. (When
following, a last line still missing its newline is waited for, not rejected.)
"""

from __future__ import annotations

import os
import socket
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import msgspec
from rich.text import Text

from runtime.errors import ConfigError
from runtime.events import kinds as ev
from runtime.events.kinds import Dropped, Event, Unrecognized, decode
from runtime.events.stream import default_socket_dir, live_sockets
from runtime.scheduling.priority import FOREGROUND
from runtime.scheduling.units import format_duration

Item = Event | Unrecognized | Dropped
Line = tuple[bytes, Item]


def parse_line(raw: bytes, where: str) -> Item:
    """Decode one stream line; `where` ("events.jsonl:17") names it in errors."""
    try:
        return decode(raw)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{where}: not a slotswarm event ({exc}): {_clip(raw)}") from None
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{where}: not a JSON line ({exc}): {_clip(raw)}") from None


def _clip(raw: bytes, n: int = 80) -> str:
    text = raw.decode("utf-8", "replace").strip()
    return text if len(text) <= n else text[: n - 1] + "…"


# ---------------------------------------------------------------- sources


def resolve_source(path: str | os.PathLike[str] | None) -> tuple[str, Path]:
    """("file" | "socket", path) for a tail argument; None means the newest
    running swarm."""
    if path is None:
        sockets = live_sockets()
        if not sockets:
            raise ConfigError(
                f"no swarm is running (no live event socket in {default_socket_dir()}); "
                "pass an events file instead, e.g. `swarm tail events.jsonl`"
            )
        return "socket", sockets[0]
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file or socket") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    if stat.S_ISSOCK(mode):
        return "socket", path
    if stat.S_ISDIR(mode):
        raise ConfigError(f"{path} is a directory; pass an events file (.jsonl) or a swarm socket")
    return "file", path


def read_file(
    path: str | os.PathLike[str],
    *,
    follow: bool = False,
    wait: Callable[[], bool] | None = None,
) -> Iterator[Line]:
    """Every line of an events file. With `follow`, keep going as lines are
    appended: at the end of the file `wait()` is called, which pauses and returns
    whether to keep following (default: sleep 0.2 s, forever)."""
    wait = wait or _sleep_a_little
    name = os.fspath(path)
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read: {exc.strerror}") from None
    with f:
        number = 0
        pending = b""
        while True:
            chunk = f.readline()
            if chunk.endswith(b"\n") or (chunk and not follow):
                number += 1
                raw, pending = pending + chunk, b""
                if raw.strip():
                    yield raw, parse_line(raw, f"{name}:{number}")
                continue
            # End of the file for now; a partial last line waits for its newline.
            pending += chunk
            if not follow or not wait():
                if pending.strip():
                    raise ConfigError(f"{name}:{number + 1}: the file ends in the middle of a line")
                return
            if _was_truncated(f, name):
                number, pending = 0, b""
                f.seek(0)


def _was_truncated(f, name: str) -> bool:
    try:
        return os.stat(name).st_size < f.tell()
    except OSError:
        return False


def _sleep_a_little() -> bool:
    time.sleep(0.2)
    return True


def read_socket(path: str | os.PathLike[str]) -> Iterator[Line]:
    """Every event a running swarm streams, until it stops."""
    name = os.fspath(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(name)
    except ConnectionRefusedError:
        sock.close()
        raise ConfigError(f"{name}: no swarm is listening there any more (a stale socket)") from None
    except OSError as exc:
        sock.close()
        raise ConfigError(f"{name}: cannot connect: {exc.strerror}") from None
    with sock, sock.makefile("rb") as f:
        for number, raw in enumerate(f, start=1):
            if raw.strip():
                yield raw, parse_line(raw, f"{name} line {number}")


# ---------------------------------------------------------------- filters


def make_filter(agents: Sequence[str] = (), events: Sequence[str] = ()) -> Callable[[Item], bool]:
    """A predicate keeping what `--agent` / `--event` ask for. An agent matches
    the event's agent or the agent that caused it (`by_agent`). An event pattern
    is a glob (`turn.*`) if it has glob characters, else a prefix (`turn`,
    `kv.swap`, `turn.preempted`). Dropped notices are always kept: they say the
    view has gaps."""
    agents = set(agents)
    names = [kind.__struct_config__.tag for kind in ev.KINDS]
    for pattern in events:
        if not any(ev.name_matches(_Named(name), [pattern]) for name in names):
            raise ConfigError(f"--event {pattern!r} matches no event; the events are: {', '.join(names)}")

    def keep(item: Item) -> bool:
        if isinstance(item, Dropped):
            return True
        fields = ev.fields_of(item)
        if agents and fields.get("agent") not in agents and fields.get("by_agent") not in agents:
            return False
        return not events or ev.name_matches(item, events)

    return keep


class _Named:
    def __init__(self, name: str) -> None:
        self.event = name


def filtered(lines: Iterable[Line], keep: Callable[[Item], bool]) -> Iterator[Line]:
    return (line for line in lines if keep(line[1]))


def in_time_order(lines: Iterator[Line]) -> Iterator[Line]:
    """Every line of a finished file, stably sorted by time (a Dropped notice keeps
    the time of the line before it)."""
    keyed, t = [], 0.0
    for line in lines:
        t = getattr(line[1], "t", t)
        keyed.append((t, line))
    if hasattr(lines, "close"):
        lines.close()
    return (line for _, line in sorted(keyed, key=lambda k: k[0]))


# ---------------------------------------------------------------- showing events

STYLES: dict[type, str] = {
    ev.SwarmStarted: "bold white",
    ev.SwarmStopped: "bold white",
    ev.Queued: "dim",
    ev.Admitted: "cyan",
    ev.Preempted: "bold yellow",
    ev.Resumed: "green",
    ev.Progress: "dim",
    ev.Finished: "blue",
    ev.Cancelled: "yellow",
    ev.Failed: "bold red",
    ev.Inherited: "magenta",
    ev.Restored: "dim magenta",
    ev.SwappedOut: "dark_orange",
    ev.SwappedIn: "dark_cyan",
    ev.Recomputed: "red",
    ev.AgentCrashed: "bold red",
    ev.StepAbandoned: "yellow",
    ev.ToolCalled: "green",
}


def render(item: Item) -> Text:
    """One pretty line: time, step, event, agent, turn, slot, priority, phrase."""
    if isinstance(item, Dropped):
        return Text(f"{'':>10} {'':>7}  … {item.count} events dropped: this viewer fell behind", "bold red")
    e = item
    fields = ev.fields_of(e)
    priority = fields.get("priority")
    fg = priority is not None and priority >= FOREGROUND
    line = Text()
    line.append(f"{e.t:9.3f}s ", "dim")
    line.append(f"{e.step:>7} ", "dim")
    line.append(f"{e.event:<19}", STYLES.get(type(e), "white"))
    line.append(f"{_or_blank(fields.get('agent')):<12.12} ", "bold" if fg else "")
    line.append(f"{_or_blank(fields.get('turn'), 't'):>5} ")
    line.append(f"{_or_blank(fields.get('slot'), 's'):>4} ")
    line.append(f"{_or_blank(priority, 'p'):>4}  ", "bold" if fg else "dim")
    if owner := fields.get("owner"):  # a cluster: which GPU owner decided it
        line.append(f"{owner}: ", "magenta")
    line.append(describe(e))
    return line


def _or_blank(value: object, prefix: str = "") -> str:
    return "" if value is None else f"{prefix}{value}"


# One phrase a kind; `who` is "turn N (agent)", and durations come formatted.
PHRASES: dict[type, str] = {
    ev.SwarmStopped: "swarm down",
    ev.Queued: "{who} queued at prio {e.priority}, prompt {e.tokens} tokens",
    ev.Admitted: "{who} got slot {e.slot} after waiting {waited}{cached}",
    ev.Preempted: "{who} paused at token {e.tokens}, slot {e.slot} given to turn {e.by_turn} ({e.by_agent}, prio {e.by_priority})",
    ev.Resumed: "{who} back in slot {e.slot} after {paused} paused",
    ev.Progress: "{who} at token {e.tokens}",
    ev.Finished: "{who} finished ({e.reason}) after {e.tokens} tokens, slot {e.slot} free",
    ev.Cancelled: "{who} cancelled at token {e.tokens}: {e.reason}",
    ev.Failed: "{who} failed at token {e.tokens}: {e.reason}",
    ev.Inherited: "{e.agent} runs at prio {e.priority} (base {e.base_priority}): {e.by_agent} waits on it",
    ev.Restored: "{e.agent} back to prio {e.priority}",
    ev.SwappedOut: "{who} KV moved to host memory ({e.blocks} blocks)",
    ev.SwappedIn: "{who} KV back on the device ({e.blocks} blocks), slot {e.slot}",
    ev.Recomputed: "{who} KV dropped, re-prefilling {e.tokens} tokens{cached}",
    ev.AgentCrashed: "agent {e.agent} crashed: {e.reason}",
    ev.StepAbandoned: "step of {e.turns} turns ({e.tokens} tokens) stopped early for {e.by_agent} (prio {e.by_priority}); it runs again",
    ev.ToolCalled: "{e.agent} ran tool {e.tool} ({e.status}) in {duration}",
}

CACHED = {  # what the prefix cache gave, where it gave some
    ev.Admitted: ", {} prompt tokens from the prefix cache",
    ev.Recomputed: " ({} more from the prefix cache)",
}


def describe(e: Event | Unrecognized) -> str:
    """A short human phrase for an event, e.g. "turn 12 (tests) paused at token
    87, slot 3 given to turn 40 (pair, prio 10)"."""
    if isinstance(e, ev.SwarmStarted):
        model = f", model {e.model}" if e.model else ""
        device = f" on {e.device}" if e.device else ""
        return f"swarm up: {e.slots} slots, policy {e.policy}{model}{device}"
    phrase = PHRASES.get(type(e))
    if phrase is None:  # an event newer than this viewer: its fields, plainly
        return " ".join(f"{k}={v}" for k, v in ev.fields_of(e).items() if v is not None)
    who = f"turn {e.turn} ({e.agent})" if isinstance(e, ev.TurnEvent) else ""
    waited, paused, duration = (format_duration(getattr(e, name, None)) for name in ("waited_s", "paused_s", "duration_s"))
    cached = getattr(e, "cached_tokens", None)
    return phrase.format(
        e=e, who=who, waited=waited, paused=paused, duration=duration, cached=CACHED.get(type(e), "").format(cached) if cached else ""
    )
