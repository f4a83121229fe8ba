"""What agents and the GPU owner say to each other.

Agents send `OwnerRequest`s over the owner's request channel; the owner answers
each turn on that turn's own channel with its tokens and its events.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

from runtime.engine import GREEDY, Sampling
from runtime.events import TurnEvent

# ------------------------------------------------------------------ requests


class TurnRequest(msgspec.Struct, tag="turn", kw_only=True):
    agent: str
    priority: int
    prompt: list[int]
    max_tokens: int
    sampling: Sampling = GREEDY
    ignore_eos: bool = False
    t: float = 0.0  # when the agent asked, on the swarm's clock: the wait starts here
    # Where the owner answers: the send end of an anyio memory stream of
    # TurnUpdate, made by the agent for this turn. (A reply address, not data.)
    reply: Any = None


class CancelTurn(msgspec.Struct, tag="cancel", kw_only=True):
    turn: int
    reason: str = "cancelled"


class CancelAgent(msgspec.Struct, tag="cancel_agent", kw_only=True):
    """End every turn of an agent: it crashed or stopped."""

    agent: str
    reason: str


class SetInherited(msgspec.Struct, tag="inherit", kw_only=True):
    agent: str
    priority: int | None  # None: back to its own


OwnerRequest = Union[TurnRequest, CancelTurn, CancelAgent, SetInherited]

# ------------------------------------------------------------------- updates


class Token(msgspec.Struct, tag="token", kw_only=True):
    """A sampled token. The rest of what a turn's channel carries are the turn's
    own events (`runtime.events.TurnEvent`), the very objects the log gets."""

    turn: int
    token: int
    t: float  # on the swarm's clock


TurnUpdate = Union[Token, TurnEvent]
