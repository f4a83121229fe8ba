"""Where an agent's turns run: placement policies for a cluster of GPU owners.

An agent is placed when it first asks for a turn and stays on that owner while
its KV lives there (its conversation and cached prefix are on that device), which
in practice means until the owner is lost. A policy only answers the first
question, "which owner for this agent?", from a snapshot of the owners' loads.

Load is the *effective priority mass* of an owner's live turns: each live turn
counts its effective priority plus one, so one foreground turn outweighs several
background ones and a new foreground agent lands where it has the least to preempt.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from runtime.errors import ConfigError


@dataclass(frozen=True)
class OwnerLoad:
    name: str
    mass: int  # sum over live turns of (effective priority + 1)
    turns: int
    model: str | None = None


class Placement(Protocol):
    def place(self, agent: str, owners: Sequence[OwnerLoad]) -> str:
        """The name of the owner the agent's turns will run on. `owners` holds
        only live owners and is never empty."""
        ...


class LeastLoaded:
    """The owner with the least effective priority mass; ties go to the fewest
    turns, then the name, so placement is deterministic."""

    def place(self, agent: str, owners: Sequence[OwnerLoad]) -> str:
        return min(owners, key=lambda o: (o.mass, o.turns, o.name)).name


@dataclass
class Pinned:
    """Pin agents to an owner by name, or to whichever owner serves a model;
    everyone else is placed by `fallback`. A pin to an owner that is gone
    falls back too (the turn must run somewhere)."""

    owners: Mapping[str, str] = field(default_factory=dict)  # agent -> owner name
    models: Mapping[str, str] = field(default_factory=dict)  # agent -> model name
    fallback: Placement = field(default_factory=LeastLoaded)

    def place(self, agent: str, owners: Sequence[OwnerLoad]) -> str:
        names = {o.name for o in owners}
        if (pinned := self.owners.get(agent)) in names:
            return pinned
        if (model := self.models.get(agent)) is not None:
            serving = [o for o in owners if o.model == model]
            if serving:
                return self.fallback.place(agent, serving)
        return self.fallback.place(agent, owners)


class Router:
    """Sticky placement plus the load book-keeping the policy reads.

    The driver knows every live turn it routed and each turn's effective
    priority, so loads need no round trip to the owners."""

    def __init__(self, owners: Mapping[str, str | None], policy: Placement | None = None) -> None:
        if not owners:
            raise ConfigError("a cluster needs at least one GPU owner")
        self.policy = policy or LeastLoaded()
        self.models = dict(owners)  # owner name -> model name (None: unknown)
        self.live = set(owners)
        self.home: dict[str, str] = {}  # agent -> owner
        self.turns: dict[int, tuple[str, Callable[[], int]]] = {}  # turn -> (owner, effective priority)

    def owner_for(self, agent: str) -> str:
        home = self.home.get(agent)
        if home not in self.live:
            if not self.live:
                raise ConfigError("every GPU owner of the cluster is lost")
            home = self.home[agent] = self.policy.place(agent, self.loads())
        return home

    def loads(self) -> list[OwnerLoad]:
        mass = {name: 0 for name in self.live}
        count = dict.fromkeys(self.live, 0)
        for owner, priority in self.turns.values():
            if owner in mass:
                mass[owner] += priority() + 1
                count[owner] += 1
        return [OwnerLoad(name, mass[name], count[name], self.models.get(name)) for name in sorted(self.live)]

    def started(self, turn: int, owner: str, priority: Callable[[], int]) -> None:
        self.turns[turn] = (owner, priority)

    def ended(self, turn: int) -> None:
        self.turns.pop(turn, None)

    def lost(self, owner: str) -> None:
        """An owner died: its agents are placed afresh on their next turn."""
        self.live.discard(owner)
        for agent in [a for a, home in self.home.items() if home == owner]:
            del self.home[agent]

    def agents_on(self, owner: str) -> list[str]:
        return sorted(a for a, home in self.home.items() if home == owner)
