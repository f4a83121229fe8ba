"""Session files and the runner behind `swarm run`.

A session file (TOML) says which model, how many slots, which agents:

    model = "path/to.gguf"        # optional: the default model otherwise
    slots = 8
    policy = "resident"
    workspace = "my_project"      # relative to the session file
    out = "swarm-out"             # each run writes into out/<timestamp>/
    duration = 120                # seconds; optional
    script = ["what does report.py do?", "review pricing.py"]

    [[agents]]
    class = "pair"                # a built-in name, or "package.module:Class"
    name = "pair"
    priority = "foreground"

    [[agents]]
    class = "reviewer"
    name = "reviewer"
    options = { parallel = 2 }

Bad fields are errors naming the field and its line. An agent class that cannot
be imported or built is reported and left out; the session goes on.
"""

from __future__ import annotations

import importlib
import inspect
import re
import time
import tomllib
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import anyio
import msgspec

from runtime.errors import ConfigError
from runtime.priority import BACKGROUND, FOREGROUND

DEMO_SESSION = Path(__file__).with_name("demo.toml")


class AgentSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    class_: str = msgspec.field(name="class")
    name: str | None = None
    priority: int | str = "background"
    options: dict[str, Any] = {}


class Session(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model: str | None = None
    device: str | None = None
    slots: int = 8
    policy: str = "resident"
    step_tokens: int | None = None
    workspace: str = "."
    out: str = "swarm-out"
    duration: float | None = None  # seconds; None: until the foreground is done (or Ctrl-C)
    turns: int | None = None  # foreground messages before stopping
    script: list[str] | str | None = None  # foreground messages (or a file of them)
    interval: float = 10.0  # seconds before each scripted message
    log_text: bool = False  # let agents keep prompts/answers in their own out files
    agents: list[AgentSpec] = []
    # Where the file was read from: relative paths resolve against it.
    base: str = msgspec.field(default=".", name="__base__")


def load_session(path: str | Path) -> Session:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"session file {path}: {exc.strerror or exc}") from None
    return parse_session(text, where=str(path), base=path.resolve().parent)


def parse_session(text: str, *, where: str = "<session>", base: str | Path = ".") -> Session:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not valid TOML: {exc}") from None
    if "__base__" in data:
        raise ConfigError(f"{where}: unknown field `__base__`")
    try:
        session = msgspec.convert({**data, "__base__": str(base)}, Session)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{where}{_locate(text, str(exc))}: {exc}") from None
    for i, spec in enumerate(session.agents):
        _check_priority(spec, text, where, i)
    if session.policy not in ("fcfs", "priority", "recompute", "swap", "resident"):
        raise ConfigError(f"{where}{_line_suffix(text, ['policy'])}: unknown policy {session.policy!r}")
    return session


def _check_priority(spec: AgentSpec, text: str, where: str, index: int) -> None:
    if isinstance(spec.priority, str) and spec.priority not in ("foreground", "background"):
        raise ConfigError(
            f"{where}{_line_suffix(text, ['agents', index, 'priority'])}: agents[{index}].priority must be "
            f"an integer, \"foreground\" or \"background\", got {spec.priority!r}"
        )


# ------------------------------------------------------------ error locations


def _locate(text: str, message: str) -> str:
    """', line N' for the key a msgspec error is about, or '' if not found."""
    at = re.search(r"at `\$((?:\.[A-Za-z_][\w-]*|\[\d+\])*)`", message)
    path: list[str | int] = []
    if at:
        for name, index in re.findall(r"\.([A-Za-z_][\w-]*)|\[(\d+)\]", at.group(1)):
            path.append(name if name else int(index))
    key = re.search(r"(?:unknown|missing required) field `([^`]+)`", message)
    if key and "unknown" in message:
        path.append(key.group(1))
    return _line_suffix(text, path)


def _line_suffix(text: str, path: list[str | int]) -> str:
    line = find_line(text, path)
    return f", line {line}" if line else ""


def find_line(text: str, path: list[str | int]) -> int | None:
    """The 1-based line of a key in TOML text, e.g. ["agents", 1, "name"]: the
    `name = ` line after the second `[[agents]]` header. Best effort."""
    lines = text.splitlines()
    start, end = 0, len(lines)
    i = 0
    while i < len(path):
        part = path[i]
        nxt = path[i + 1] if i + 1 < len(path) else None
        if isinstance(part, str) and isinstance(nxt, int):
            # An array of tables: the nxt-th [[part]] header, up to the next header.
            headers = [n for n in range(start, end) if re.match(rf"\s*\[\[\s*{re.escape(part)}\s*\]\]", lines[n])]
            if nxt < len(headers):
                start = headers[nxt]
                end = next((n for n in range(start + 1, len(lines)) if re.match(r"\s*\[", lines[n])), len(lines))
                i += 2
                continue
            return _key_line(lines, start, end, part)
        if isinstance(part, str):
            found = _key_line(lines, start, end, part)
            if found is None:
                return None
            if i == len(path) - 1:
                return found
            start = found - 1
        i += 1
    return start + 1 if path else None


def _key_line(lines: list[str], start: int, end: int, key: str) -> int | None:
    pattern = re.compile(rf"^\s*(\"?){re.escape(key)}\1\s*=|[{{,]\s*{re.escape(key)}\s*=|^\s*\[+\s*{re.escape(key)}\s*\]")
    for n in range(start, end):
        if pattern.search(lines[n]):
            return n + 1
    return None


# ------------------------------------------------------------------- agents


@dataclass
class LoadedAgents:
    agents: list[Any] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # one line per agent left out


def priority_of(spec: AgentSpec) -> int:
    if isinstance(spec.priority, int):
        return spec.priority
    return FOREGROUND if spec.priority == "foreground" else BACKGROUND


def import_agent_class(name: str) -> type:
    """A built-in agent's short name ("reviewer"), or "package.module:Class"."""
    from agents import BUILTIN
    from swarm import Agent

    if name in BUILTIN:
        return BUILTIN[name]
    module_name, colon, attr = name.partition(":")
    if not colon or not module_name or not attr:
        raise ConfigError(f"agent class {name!r}: use a built-in name ({', '.join(BUILTIN)}) or \"module:Class\"")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigError(f"agent class {name!r}: cannot import {module_name}: {type(exc).__name__}: {exc}") from None
    cls = getattr(module, attr, None)
    if cls is None:
        raise ConfigError(f"agent class {name!r}: module {module_name} has no {attr}")
    if not (isinstance(cls, type) and issubclass(cls, Agent)):
        raise ConfigError(f"agent class {name!r} is not a subclass of swarm.Agent")
    return cls


def build_agents(session: Session, workspace: Path, out: Path, say: Callable[[str], None] | None = None) -> LoadedAgents:
    """Instantiate the session's agents. Shared settings (workspace, out, script...)
    are passed to a class only if its __init__ takes them."""
    loaded = LoadedAgents()
    script = session.script
    if isinstance(script, str):
        script = str(_resolve(session, script))
    shared = {
        "workspace": workspace, "out": out, "log_text": session.log_text,
        "script": script, "interval_s": session.interval, "turns": session.turns, "say": say,
    }
    for i, spec in enumerate(session.agents):
        name = spec.name or spec.class_.rpartition(":")[2].lower()
        try:
            cls = import_agent_class(spec.class_)
            params = inspect.signature(cls.__init__).parameters
            kwargs = {k: v for k, v in shared.items() if k in params and v is not None}
            if priority_of(spec) < FOREGROUND:  # the script is the person's part
                for k in ("script", "interval_s", "turns", "say"):
                    kwargs.pop(k, None)
            loaded.agents.append(cls(name, priority_of(spec), **{**kwargs, **spec.options}))
        except Exception as exc:
            loaded.problems.append(f"agent {name!r} (agents[{i}], class {spec.class_!r}) left out: {exc}")
    return loaded


def _resolve(session: Session, path: str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path(session.base) / p


def workspace_of(session: Session) -> Path:
    ws = _resolve(session, session.workspace)
    if not ws.is_dir():
        raise ConfigError(f"workspace {str(ws)!r} does not exist or is not a folder")
    return ws.resolve()


def new_out_dir(session: Session) -> Path:
    """out/<timestamp>/ (relative `out` is relative to the current folder)."""
    root = Path(session.out).expanduser()
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    out = root / stamp
    n = 1
    while out.exists():
        n += 1
        out = root / f"{stamp}-{n}"
    out.mkdir(parents=True)
    return out.resolve()


# ------------------------------------------------------------------- runner


class SessionRunner:
    """Runs one session. `run()` is async; `events_path`, `agents` and `problems`
    stay readable afterwards (also after Ctrl-C) for the summary."""

    def __init__(self, session: Session, *, engine: Any = None, out: Path | None = None, socket: Path | str | None = None,
                 on_event: Callable[[Any], None] | None = None, say: Callable[[str], None] | None = None) -> None:
        self.session = session
        self.workspace = workspace_of(session)  # fail early, before loading a model
        self.engine = engine
        self.out = out or new_out_dir(session)
        self.events_path = self.out / "events.jsonl"
        self.socket = socket
        self.on_event = on_event
        self.say = say
        loaded = build_agents(session, self.workspace, self.out, say)
        self.agents, self.problems = loaded.agents, loaded.problems
        self.started = self.stopped = None

    def load_engine(self) -> Any:
        if self.engine is None:
            from gpu.engine import OpenCLEngine
            from gpu.fetch import resolve_model

            model = resolve_model(_resolve(self.session, self.session.model) if self.session.model else None)
            self.engine = OpenCLEngine(model, device=self.session.device)
            self.model_name = model.name
        return self.engine

    async def run(self) -> None:
        from swarm.api import Swarm

        s = self.session
        engine = self.load_engine()
        swarm = Swarm(
            engine, slots=s.slots, policy=s.policy, step_tokens=s.step_tokens, events=self.events_path,
            socket=self.socket, model_name=getattr(self, "model_name", None),
        )
        self.started = time.monotonic()
        try:
            async with anyio.create_task_group() as viewers:
                if self.on_event is not None:
                    # From swarm.started on; ends by itself when the swarm closes its event stream.
                    viewers.start_soon(self._forward, swarm.bus.subscribe())
                async with swarm:
                    self.swarm = swarm
                    # Background first, so the foreground arrives to a busy GPU.
                    order = sorted(self.agents, key=lambda a: a.priority)
                    self._done = [_signal_when_run_returns(a) for a in order if a.priority >= FOREGROUND]
                    for agent in order:
                        await swarm.spawn(agent)
                    await self._until_done()
        finally:
            self.stopped = time.monotonic()

    async def _until_done(self) -> None:
        """Until the duration is up, or every foreground agent has finished."""
        with anyio.move_on_after(self.session.duration if self.session.duration is not None else float("inf")):
            if not self._done:
                await anyio.sleep_forever()
            for done in self._done:
                await done.wait()

    async def _forward(self, sub: Any) -> None:
        async for item in sub:
            self.on_event(item)


def _signal_when_run_returns(agent: Any) -> anyio.Event:
    """An event set when the agent's run() ends (returns or raises): an actor
    whose run() returns keeps serving its mailbox, so joining it would not do."""
    done = anyio.Event()
    run = getattr(agent, "run", None)
    if run is None:
        done.set()
        return done

    async def run_then_signal() -> None:
        try:
            await run()
        finally:
            done.set()

    agent.run = run_then_signal
    return done


# ------------------------------------------------------------------ summary


@dataclass
class AgentSummary:
    turns: int = 0
    tokens: int = 0
    paused_s: float = 0.0
    preempted: int = 0
    inherited: int = 0
    crashed: str | None = None


@dataclass
class Summary:
    agents: dict[str, AgentSummary]
    fg_wait_s: list[float]  # request to slot, turns run at foreground priority
    fg_ttft_s: list[float]  # request to first token, from the agents' records
    preemptions: int
    inheritances: int
    steps: int
    seconds: float


def summarize(events: list[Any], agents: list[Any] = ()) -> Summary:
    """Per-agent counts from the event log; time to first token from the agents'
    own records (events carry no per-token times)."""
    from runtime.events import TERMINAL

    per: dict[str, AgentSummary] = {a.name: AgentSummary() for a in agents}
    fg_wait: list[float] = []
    for e in events:
        if e.agent is None or e.agent == "gpu":
            continue
        s = per.setdefault(e.agent, AgentSummary())
        if e.event == "turn.queued":
            s.turns += 1
        elif e.event in TERMINAL:
            s.tokens += e.tokens or 0
        elif e.event == "turn.resumed":
            s.paused_s += e.paused_s or 0.0
        elif e.event == "turn.preempted":
            s.preempted += 1
        elif e.event == "priority.inherited":
            s.inherited += 1
        elif e.event == "agent.crashed":
            s.crashed = e.reason
        if e.event == "turn.admitted" and (e.priority or 0) >= FOREGROUND and e.waited_s is not None:
            fg_wait.append(e.waited_s)
    # Agents that keep TurnRecords time from the request leaving the agent, which
    # the event log cannot (a request is logged at the next token boundary).
    records = [r for a in agents for r in getattr(a, "records", []) if r.priority >= FOREGROUND and r.ttft_s is not None]
    if records:
        fg_wait = [r.waited_s for r in records]
    ttft = [r.ttft_s for r in records]
    return Summary(
        agents=per,
        fg_wait_s=fg_wait,
        fg_ttft_s=ttft,
        preemptions=sum(s.preempted for s in per.values()),
        inheritances=sum(s.inherited for s in per.values()),
        steps=max((e.step for e in events), default=0),
        seconds=max((e.t for e in events), default=0.0),
    )


def percentiles(samples: list[float]) -> dict[str, float] | None:
    """p50 / p90 / p99 / max, or None without samples."""
    if not samples:
        return None
    import numpy as np

    a = np.asarray(samples, dtype=float)
    return {"p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)), "p99": float(np.percentile(a, 99)), "max": float(a.max())}
