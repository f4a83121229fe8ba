"""From a session's agent list to agent objects: import each class, build it with
the settings it takes, and report (not raise) the ones that cannot be built."""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from runtime.errors import ConfigError
from runtime.files import private_dir
from runtime.priority import BACKGROUND, FOREGROUND
from swarm.session import AgentSpec, Session, agent_name



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
        script = str(resolve_path(session, script))
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


def resolve_path(session: Session, path: str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path(session.base) / p


def workspace_of(session: Session) -> Path:
    ws = resolve_path(session, session.workspace)
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
