"""The GPU client: all an agent holds of the GPU.

    turn = client.new_turn_id()
    channel = await client.submit(turn, request)   # into the GPU owner's mailbox
    await client.cancel(turn, reason)
    client.now(), client.tokenizer, client.constraints

`GPUClient` is the interface; `LocalGPU` implements it for one owner in this
process, `swarm.cluster.client.ClusterGPU` for owners spread over Ray (a test
checks both against it). A client is the single source of its swarm's turn
ids. `LocalGPU` reaches the owner only through the owner's actor mailbox, like
any other actor would. One client serves a swarm; every agent spawned into it
(and `swarm generate`, and the HTTP gateway) shares it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from runtime.errors import ActorError, TurnCancelled
from runtime.owner.messages import CancelTurn, TurnChannel, TurnRequest
from runtime.scheduling.constraints import ConstraintChecker
from runtime.scheduling.work import TextCodec

if TYPE_CHECKING:
    from runtime.actors.system import ActorSystem


@runtime_checkable
class GPUClient(Protocol):
    """What an agent holds of the GPU, wherever the GPU is."""

    now: Callable[[], float]  # the swarm's clock: what every event's `t` is on
    tokenizer: TextCodec | None
    constraints: ConstraintChecker | None  # checks a turn's constraint before it is queued

    def new_turn_id(self) -> int:
        """A turn id no other turn of this swarm has."""
        ...

    async def submit(self, turn: int, request: TurnRequest) -> TurnChannel:
        """Hand a turn to the GPU; returns the channel its tokens and events come
        back on. Raises TurnCancelled if the GPU has stopped."""
        ...

    async def cancel(self, turn: int, reason: str) -> None:
        """End a turn at the next token boundary (nothing if it has ended)."""
        ...


class LocalGPU(GPUClient):
    """The GPU client of one owner in this process, through its mailbox."""

    def __init__(
        self,
        system: ActorSystem,
        owner: str,
        clock: Callable[[], float],
        tokenizer: TextCodec | None,
        constraints: ConstraintChecker | None = None,
    ) -> None:
        self._system = system
        self._owner = owner
        self._ids = itertools.count(1)
        self.now = clock  # the swarm's clock: what every event's `t` is on
        self.tokenizer = tokenizer
        self.constraints = constraints  # checks a turn's constraint before it is queued

    def new_turn_id(self) -> int:
        return next(self._ids)

    async def submit(self, turn: int, request: TurnRequest, *, asked: float | None = None) -> TurnChannel:
        """Hand a turn to the GPU owner; returns the channel its tokens and events
        come back on, once the request is in the owner's mailbox (it is taken at
        the next token boundary). Raises TurnCancelled if the owner has stopped.
        `asked` is when the agent asked, on this swarm's clock, for a request
        relayed from another process; by default, now."""
        channel = request.reply = TurnChannel(turn)
        request.t = self.now() if asked is None else min(asked, self.now())  # the wait a person sees starts here
        try:
            # The owner's mailbox is unbounded, so this tell never waits: there is
            # no checkpoint at which a cancel could leave the request sent with
            # nobody to read its answer. (One still in the mailbox when the owner
            # stops is handed back to it, and ended: GPUOwner.on_undelivered.)
            await self._system.tell(self._owner, request)
        except ActorError as exc:
            channel.close()
            reason = "the GPU owner has stopped"
            raise TurnCancelled(f"turn {turn} of agent {request.agent!r}: {reason}", turn=turn, agent=request.agent, reason=reason) from exc
        return channel

    async def cancel(self, turn: int, reason: str) -> None:
        """End a turn at the next token boundary (nothing if it has ended)."""
        try:
            await self._system.tell(self._owner, CancelTurn(turn=turn, reason=reason))
        except ActorError:
            pass  # the owner has stopped, and ended every turn as it did
