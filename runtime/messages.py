"""What agents and the GPU owner say to each other.

Agents send `OwnerRequest`s over the owner's request channel; the owner answers
each turn on that turn's own channel with `TurnUpdate`s. Both are tagged unions,
so a viewer or a log can tell them apart by their `type` field.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

from runtime.engine import GREEDY, Sampling

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


class _Update(msgspec.Struct, kw_only=True):
    turn: int
    t: float  # on the swarm's clock


class Queued(_Update, tag="queued"):
    pass


class Admitted(_Update, tag="admitted"):
    slot: int
    waited_s: float


class Token(_Update, tag="token"):
    token: int


class Paused(_Update, tag="paused"):
    """The turn lost its slot at a token boundary; its KV stays where the policy
    keeps it. `by_turn` is None when it was paused to free KV memory."""

    at_token: int
    by_turn: int | None
    by_agent: str | None
    by_priority: int | None


class Resumed(_Update, tag="resumed"):
    slot: int
    paused_s: float


class Ended(_Update, tag="ended"):
    event: str  # turn.finished, turn.cancelled or turn.failed
    reason: str
    tokens: int


TurnUpdate = Union[Queued, Admitted, Token, Paused, Resumed, Ended]
