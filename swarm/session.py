"""Session files: the schema `swarm run` reads, and its checks.

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

Bad fields are errors naming the field and its line (swarm.toml_lines). Agents
are built from it by swarm.agent_loading, which refuses an agent it cannot build
the same way.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from runtime.errors import ConfigError
from runtime.scheduling.drafts import split_speculation
from runtime.scheduling.turns import Policy
from swarm.toml_lines import line_suffix, locate

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
    shaping: bool = True  # build each step for the foreground turn (runtime.scheduling.shaping)
    slack: Annotated[float, Meta(ge=0)] = 0.25  # (NaN fails every bound)
    prefix_cache: bool = True  # share the K/V of prompts that start alike
    speculate: str = "off"  # speculative decoding: off, lookup, draft or draft:MODEL (runtime.scheduling.drafts)
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
    # The file's name and text, so the agents' checks (swarm.agent_loading) can name a line.
    where: str = msgspec.field(default="<session>", name="__where__")
    text: str = msgspec.field(default="", name="__text__")


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
    for key in data:
        if key.startswith("__"):
            raise ConfigError(f"{where}{line_suffix(text, [key])}: unknown field `{key}`")
    try:
        session = msgspec.convert({**data, "__base__": str(base), "__where__": where, "__text__": text}, Session)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{where}{locate(text, str(exc))}: {exc}") from None
    seen: dict[str, int] = {}
    for i, spec in enumerate(session.agents):
        _check_priority(spec, text, where, i)
        name = agent_name(spec)
        if name in seen:
            raise ConfigError(
                f"{where}{line_suffix(text, ['agents', i, 'name' if spec.name else 'class'])}: agents[{i}] is named "
                f"{name!r} like agents[{seen[name]}]; give each agent its own name"
            )
        seen[name] = i
    try:
        Policy.parse(session.policy)
    except ConfigError as exc:
        raise ConfigError(f"{where}{line_suffix(text, ['policy'])}: {exc}") from None
    try:
        split_speculation(session.speculate)
    except ConfigError as exc:
        raise ConfigError(f"{where}{line_suffix(text, ['speculate'])}: {exc}") from None
    return session


def _check_priority(spec: AgentSpec, text: str, where: str, index: int) -> None:
    if isinstance(spec.priority, str) and spec.priority not in ("foreground", "background"):
        raise ConfigError(
            f"{where}{line_suffix(text, ['agents', index, 'priority'])}: agents[{index}].priority must be "
            f'an integer, "foreground" or "background", got {spec.priority!r}'
        )


def agent_name(spec: AgentSpec) -> str:
    return spec.name or spec.class_.rpartition(":")[2].lower()
