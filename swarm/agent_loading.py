"""From a session's agent list to agent objects: import each class, check the
options against what its constructors take, and build it with the settings it
takes. An agent that cannot be built is a ConfigError naming its line in the
session file and the valid choices: a session never starts without one of its
agents."""

from __future__ import annotations

import difflib
import importlib
import inspect
import typing
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec

from runtime.errors import ConfigError, SlotswarmError
from runtime.events.files import private_dir
from runtime.scheduling.priority import BACKGROUND, FOREGROUND
from swarm.session import AgentSpec, Session, agent_name
from swarm.toml_lines import line_suffix


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
        raise ConfigError(
            f'unknown agent class {name!r}{did_you_mean(name, BUILTIN)}: use a built-in name ({", ".join(BUILTIN)}) or "module:Class"'
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the module's own code runs here: whatever it raises is its problem to report
        raise ConfigError(f"agent class {name!r}: cannot import {module_name}: {type(exc).__name__}: {exc}") from None
    cls = getattr(module, attr, None)
    if cls is None:
        agents = [n for n, v in vars(module).items() if isinstance(v, type) and issubclass(v, Agent)]
        raise ConfigError(f"agent class {name!r}: module {module_name} has no {attr}{did_you_mean(attr, agents)}")
    if not (isinstance(cls, type) and issubclass(cls, Agent)):
        raise ConfigError(f"agent class {name!r} is not a subclass of swarm.Agent")
    return cls


def did_you_mean(name: str, choices: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def agent_options(cls: type) -> tuple[dict[str, Any], bool]:
    """The keyword settings `cls` takes, with their types where they can be read,
    gathered up its constructors' chain of **kwargs; and whether the chain ends in
    one that takes anything (then an unknown name is the constructor's to refuse)."""
    options: dict[str, Any] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            hints = typing.get_type_hints(init)
        except Exception:  # an annotation that names what the module imports only for type checkers
            hints = {}
        params = list(inspect.signature(init).parameters.values())[1:]  # past self
        for p in params:
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in ("name", "priority"):
                options.setdefault(p.name, hints.get(p.name, Any))
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            return options, False
    return options, True


class OptionError(ConfigError):
    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option


def check_options(cls: type, options: dict[str, Any]) -> None:
    """Each option is one `cls` takes, of the type it declares."""
    takes, open_ended = agent_options(cls)
    for key, value in options.items():
        if key not in takes:
            if open_ended:
                continue
            raise OptionError(key, f"unknown option {key!r}{did_you_mean(key, takes)}; it takes {', '.join(sorted(takes))}")
        try:
            msgspec.convert(value, takes[key], strict=True)
        except msgspec.ValidationError as exc:
            raise OptionError(key, f"option {key} = {value!r}: {exc}") from None
        except TypeError:  # a type msgspec does not check (a callable, a Path): the constructor's to check
            pass


def build_agents(session: Session, workspace: Path, out: Path, say: Callable[[str], None] | None = None) -> list[Any]:
    """Instantiate the session's agents. Shared settings (workspace, out, script...)
    are passed to a class only if its __init__ takes them."""
    agents = []
    script = session.script
    if isinstance(script, str):
        script = str(resolve_path(session, script))
    shared = {
        "workspace": workspace,
        "out": out,
        "log_text": session.log_text,
        "script": script,
        "interval_s": session.interval,
        "turns": session.turns,
        "say": say,
    }
    for i, spec in enumerate(session.agents):
        name = agent_name(spec)
        try:
            cls = import_agent_class(spec.class_)
        except ConfigError as exc:
            raise _agent_error(session, i, ["class"], exc) from None
        try:
            check_options(cls, spec.options)
        except OptionError as exc:
            raise _agent_error(session, i, ["options", exc.option], exc) from None
        params = inspect.signature(cls.__init__).parameters
        kwargs = {k: v for k, v in shared.items() if k in params and v is not None}
        if priority_of(spec) < FOREGROUND:  # the script is the person's part
            for k in ("script", "interval_s", "turns", "say"):
                kwargs.pop(k, None)
        try:
            agents.append(cls(name, priority_of(spec), **{**kwargs, **spec.options}))
        except Exception as exc:  # the agent's own constructor, maybe the user's code: say what it refused
            raise _agent_error(session, i, ["options"] if spec.options else ["class"], exc) from None
    return agents


def _agent_error(session: Session, index: int, key: list[str], exc: Exception) -> ConfigError:
    spec = session.agents[index]
    line = line_suffix(session.text, ["agents", index, *key]) or line_suffix(session.text, ["agents", index, "class"])
    message = str(exc) if isinstance(exc, (SlotswarmError, ValueError, TypeError)) else f"{type(exc).__name__}: {exc}"
    return ConfigError(f"{session.where}{line}: agents[{index}] ({agent_name(spec)!r}, class {spec.class_!r}): {message}")


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
