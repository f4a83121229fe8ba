"""Session files and the runner behind `swarm run`.

A session file (TOML) says which model, how many slots, which agents:

    model = "path/to.gguf"        # optional: the default model otherwise
    slots = 8
    policy = "resident"
    prefix_cache = true           # reuse the K/V of prompts that start alike
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
import tomllib
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Callable

import msgspec
from msgspec import Meta

from runtime.errors import ConfigError
from runtime.files import private_dir
from runtime.priority import BACKGROUND, FOREGROUND
from runtime.turns import Policy

DEMO_SESSION = Path(__file__).with_name("demo.toml")


class AgentSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    class_: str = msgspec.field(name="class")
    name: Annotated[str, Meta(min_length=1)] | None = None
    priority: int | str = "background"
    options: dict[str, Any] = {}


class Session(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model: str | None = None
    device: str | None = None
    kernels: str | None = None  # kernel family: auto, cpu or gpu
    slots: Annotated[int, Meta(ge=1)] = 8
    policy: str = "resident"
    step_tokens: Annotated[int, Meta(ge=1)] | None = None
    shaping: bool = True  # build each step for the foreground turn (runtime.shaping)
    slack: Annotated[float, Meta(ge=0)] = 0.25  # (NaN fails every bound)
    prefix_cache: bool = True  # share the K/V of prompts that start alike
    workspace: str = "."
    out: str = "swarm-out"
    duration: Annotated[float, Meta(gt=0)] | None = None  # seconds; None: until the foreground is done (or Ctrl-C)
    turns: Annotated[int, Meta(ge=1)] | None = None  # foreground messages before stopping
    script: list[str] | str | None = None  # foreground messages (or a file of them)
    interval: Annotated[float, Meta(ge=0)] = 10.0  # seconds before each scripted message
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
    seen: dict[str, int] = {}
    for i, spec in enumerate(session.agents):
        _check_priority(spec, text, where, i)
        name = agent_name(spec)
        if name in seen:
            raise ConfigError(
                f"{where}{_line_suffix(text, ['agents', i, 'name' if spec.name else 'class'])}: agents[{i}] is named "
                f"{name!r} like agents[{seen[name]}]; give each agent its own name"
            )
        seen[name] = i
    try:
        Policy.parse(session.policy)
    except ConfigError as exc:
        raise ConfigError(f"{where}{_line_suffix(text, ['policy'])}: {exc}") from None
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


def agent_name(spec: AgentSpec) -> str:
    return spec.name or spec.class_.rpartition(":")[2].lower()


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
        name = agent_name(spec)
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
    private_dir(out)
    return out.resolve()


# ------------------------------------------------------------------- runner
