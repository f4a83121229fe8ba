"""What agents and the GPU owner say to each other.

Agents send `OwnerRequest`s to the GPU owner's mailbox (through runtime.owner.client);
the owner answers each turn on that turn's own channel with its tokens and its
events.
"""

from __future__ import annotations

from typing import Any

import msgspec

from runtime.actors.channel import UpdateReceiver, UpdateSender, open_channel
from runtime.events.kinds import TurnEvent
from runtime.scheduling.constraints import Choices, Constraint, Grammar, JsonSchema, Regex, constraint_problem  # noqa: F401 (the constraints are part of a request)
from runtime.scheduling.work import GREEDY, Sampling

# ------------------------------------------------------------------ requests


class TurnRequest(msgspec.Struct, tag="turn", kw_only=True):
    agent: str
    priority: int
    prompt: list[int]
    max_tokens: int
    sampling: Sampling = GREEDY
    ignore_eos: bool = False
    # What the output must be (runtime.scheduling.constraints); None: free text.
    constraint: Constraint | None = None
    # Tokens at the prompt's end that this turn generated before, on an owner it
    # was moved from: its constraint resumes after them.
    prior_output: int = 0
    # Lift keys (runtime.actors.serving.lift_key) of the requests this turn serves: the
    # priority lent to any of them is lent to the turn.
    lifts: list[str] = []
    t: float = 0.0  # when the agent asked, on the swarm's clock: the wait starts here
    # Where the owner answers: a TurnChannel, made by the agent's GPU client for
    # this turn. (A reply address, not data.)
    reply: Any = None


class CancelTurn(msgspec.Struct, tag="cancel", kw_only=True):
    turn: int
    reason: str = "cancelled"


class CancelAgent(msgspec.Struct, tag="cancel_agent", kw_only=True):
    """End every turn of an agent: it crashed or stopped."""

    agent: str
    reason: str


class SetInherited(msgspec.Struct, tag="inherit", kw_only=True):
    lift: str  # an agent's name (all its turns) or a lift key (turns serving one request)
    priority: int | None  # None: back to its own


OwnerRequest = TurnRequest | CancelTurn | CancelAgent | SetInherited


def _int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def turn_request_problem(request: TurnRequest) -> str | None:
    """Why the owner cannot take this turn request, or None. Checked at the owner's
    boundary too (not only in Agent.generate), since anything can be sent there."""
    if not isinstance(request.agent, str) or not request.agent:
        return f"agent must be a non-empty str, got {request.agent!r}"
    if not _int(request.priority):
        return f"priority must be an int, got {request.priority!r}"
    if not isinstance(request.prompt, list) or not all(_int(t) and t >= 0 for t in request.prompt):
        return "prompt must be a list of token ids (ints >= 0)"
    if not _int(request.max_tokens) or request.max_tokens < 1:
        return f"max_tokens must be an int >= 1, got {request.max_tokens!r}"
    if not isinstance(request.sampling, Sampling):
        return f"sampling must be a Sampling, got {request.sampling!r}"
    if not isinstance(request.ignore_eos, bool):
        return f"ignore_eos must be a bool, got {request.ignore_eos!r}"
    if (problem := constraint_problem(request.constraint)) is not None:
        return problem
    if not _int(request.prior_output) or not 0 <= request.prior_output <= len(request.prompt):
        return f"prior_output must be an int in [0, len(prompt)], got {request.prior_output!r}"
    if not isinstance(request.t, (int, float)) or request.t != request.t:
        return f"t must be a time in seconds, got {request.t!r}"
    if not isinstance(request.lifts, list) or not all(isinstance(k, str) and k.startswith(f"{request.agent}/") for k in request.lifts):
        return f"lifts must name requests the agent {request.agent!r} itself serves, got {request.lifts!r}"
    return None


# ------------------------------------------------------------------- updates


class Token(msgspec.Struct, tag="token", kw_only=True):
    """A sampled token. The rest of what a turn's channel carries are the turn's
    own events (`runtime.events.kinds.TurnEvent`), the very objects the log gets."""

    turn: int
    token: int
    t: float  # on the swarm's clock


TurnUpdate = Token | TurnEvent


class TurnChannel:
    """The reply address a TurnRequest carries: the turn's id and its update
    stream. The owner sends on it and closes it at the turn's end; the turn's
    handle receives. Made by the GPU client (runtime.owner.client)."""

    def __init__(self, turn_id: int) -> None:
        self.turn_id = turn_id
        self.send: UpdateSender[TurnUpdate]
        self.receive: UpdateReceiver[TurnUpdate]
        self.send, self.receive = open_channel()

    def close(self) -> None:
        self.send.close()
        self.receive.close()
