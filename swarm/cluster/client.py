"""The GPU as agents see it when the swarm spans several owners.

`ClusterGPU` stands where a local `GPUOwner` stands for an agent: it hands out
turn ids, takes turn requests and cancels, and keeps the clock. Each turn is
routed to its agent's owner (`Router`). Each owner streams back one batch of
updates per wake-up for all its turns (`receive`), and each turn's pump moves
its own into the same per-turn channel a local owner would fill, so
`TurnHandle`, `on_pause` and `on_resume` work unchanged.

When an owner dies mid-turn, the turn is moved: its agent hears `on_pause`, the
turn is resubmitted elsewhere with its prompt plus the tokens generated so far
(recompute), and `on_resume` follows at its admission there. Greedy (and seeded)
output is unchanged, since sampling is a pure function of logits, seed and
position.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
from typing import Any, Callable

import anyio
import msgspec

from runtime.bus import EventBus
from runtime.client import GPUClient
from runtime.events import Admitted, Cancelled, Ended, Event, Failed, Finished, Preempted, Queued, Resumed, decode
from runtime.errors import ConfigError, TurnCancelled
from runtime.messages import Token, TurnChannel, TurnRequest, turn_request_problem
from runtime.serving import lift_key
from swarm.cluster.placement import Router

log = logging.getLogger(__name__)

LOST = "owner lost"  # told to a turn's pump when its owner's stream breaks
GONE = "owner stopped"  # and when it ends (the owner stopped without ending it)


def _owner_lost(exc: BaseException) -> bool:
    import ray.exceptions

    return isinstance(exc, (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError))


class ClusterGPU(GPUClient):
    """The GPU client (runtime.client.GPUClient) of owners spread over Ray."""

    def __init__(
        self, handles: dict[str, Any], offsets: dict[str, float], router: Router, bus: EventBus, tokenizer: Any, tasks: anyio.abc.TaskGroup,
        lent: Callable[[str], int | None],
    ) -> None:
        self.handles = handles  # owner name -> Ray actor handle
        self.offsets = offsets  # owner name -> its clock zero minus ours, in seconds
        self.router = router
        self.now = bus.now
        self.bus = bus
        self.tokenizer = tokenizer
        self.closed = False
        self.moves = 0  # turns moved off a lost owner
        self._tasks = tasks
        self._ids = itertools.count(1)
        self._lent = lent  # lift key -> the priority lent under it, if any: the wait graph's, asked, not copied
        self._agents: dict[int, str] = {}  # live turn -> its agent
        self._cancelled: dict[int, str] = {}  # live turn -> why its agent cancelled it
        self._inboxes: dict[int, tuple[str, Any]] = {}  # turn -> (its owner now, its pump's inbox)
        self.eos = frozenset(tokenizer.eos_ids) if tokenizer is not None else frozenset()

    def new_turn_id(self) -> int:
        return next(self._ids)

    async def submit(self, turn: int, request: TurnRequest) -> TurnChannel:
        channel = request.reply = TurnChannel(turn)
        request.t = self.now()
        if self.closed:
            channel.close()
            raise TurnCancelled(f"turn {turn} of agent {request.agent!r}: the cluster has stopped")
        problem = turn_request_problem(request)
        if problem:  # ended at once, as a local owner ends it
            failed = _failed(self.now(), turn, str(request.agent), problem)
            self.bus.emit(failed)
            channel.send.send_nowait(failed)
            channel.send.close()
        else:
            self._agents[turn] = request.agent
            self._tasks.start_soon(self._pump, request, name=f"turn {turn}")
        return channel

    async def cancel(self, turn: int, reason: str) -> None:
        if turn not in self._agents:
            return  # ended already
        self._cancelled[turn] = reason  # seen by the pump if the turn has no owner yet, or moves
        owner = self.router.turns.get(turn, (None,))[0]
        if owner in self.router.live:
            self.handles[owner].cancel.remote(turn, reason)

    def lifted(self, agent: str, via: str, priority: int | None) -> None:
        """The actor system's on_lift hook. The wait graph is all here; a lift is
        told only to the owner the holder's turns run on (its home), and a turn
        placed anywhere later carries the lifts it runs under (see `_pump`)."""
        home = self.router.home.get(agent)
        if home in self.router.live:
            self.handles[home].lift.remote(lift_key(agent, via), priority)

    def agent_stopped(self, name: str) -> None:
        for turn, agent in list(self._agents.items()):
            if agent == name:
                self._tasks.start_soon(self.cancel, turn, f"agent {name} stopped")

    # ------------------------------------------------------------------ pump

    def _priority_of(self, request: TurnRequest) -> Callable[[], int]:
        keys = [*request.lifts, request.agent]
        return lambda: max([request.priority, *(p for p in map(self._lent, keys) if p is not None)])

    async def _pump(self, request: TurnRequest) -> None:
        turn_id, out = request.reply.turn_id, request.reply.send
        tokens: list[int] = []  # generated so far, on whichever owners
        moved_at: float | None = None  # when this turn lost its owner, until it resumes
        owner = None
        inbox, updates = anyio.create_memory_object_stream[Any](math.inf)
        try:
            while (end := self._settled(request, tokens)) is None:
                owner = self.router.owner_for(request.agent)
                self.router.started(turn_id, owner, self._priority_of(request))
                self._inboxes[turn_id] = (owner, inbox)
                # On the owner's clock: its wait starts when the agent asked, crossing included.
                asked = (request.t if moved_at is None else moved_at) - self.offsets[owner]
                remote = msgspec.structs.replace(request, reply=None, prompt=request.prompt + tokens, max_tokens=request.max_tokens - len(tokens), t=asked)
                lifts = {key: p for key in request.lifts if (p := self._lent(key)) is not None}
                try:
                    await self.handles[owner].start.remote(turn_id, remote, lifts)
                except Exception as exc:
                    if not _owner_lost(exc):
                        raise
                    moved_at = self._lose(owner, turn_id, request, tokens, out)
                    continue
                async for update in updates:
                    if update == GONE:
                        return  # the stream ended without an end: the owner stopped
                    if update == LOST:
                        moved_at = self._lose(owner, turn_id, request, tokens, out)
                        break
                    if isinstance(update, Token):
                        tokens.append(update.token)
                        update = msgspec.structs.replace(update, t=update.t + self.offsets[owner])
                    else:
                        update = self._local(update, owner, moved_at, tokens)
                        if update is None:
                            continue
                        moved_at = None if isinstance(update, Resumed) else moved_at
                    out.send_nowait(update)
                    if isinstance(update, Ended):
                        return
            out.send_nowait(end)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            # The agent stopped listening before its cancel could reach an owner.
            if owner in self.router.live:
                self.handles[owner].cancel.remote(turn_id, "agent stopped listening")
        except ConfigError as exc:  # no owner left to run it
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                out.send_nowait(_ended(Failed, self.now(), request, len(tokens), str(exc)))
        finally:
            self.router.ended(turn_id)
            self._agents.pop(turn_id, None)
            self._cancelled.pop(turn_id, None)
            self._inboxes.pop(turn_id, None)
            out.close()

    async def receive(self, owner: str) -> None:
        """Hand each of an owner's batched updates to its turn's pump; when the
        stream breaks or ends, tell every turn still on that owner."""
        ending = GONE
        try:
            async for ref in self.handles[owner].updates.remote():
                for turn_id, update in await ref:
                    mine = self._inboxes.get(turn_id)
                    if mine is not None and mine[0] == owner:
                        mine[1].send_nowait(update)
        except Exception as exc:
            if not _owner_lost(exc):
                log.exception("lost the turn stream of GPU owner %s", owner)
            ending = LOST
        finally:
            for turn_id, (where, inbox) in list(self._inboxes.items()):
                if where == owner:
                    inbox.send_nowait(ending)

    def _settled(self, request: TurnRequest, tokens: list[int]) -> Ended | None:
        """How the turn ends without running (again), or None: cancelled before it
        reached an owner, or its owner died after its last token but before its end."""
        now, n = self.now(), len(tokens)
        if (reason := self._cancelled.get(request.reply.turn_id)) is not None:
            return _ended(Cancelled, now, request, n, reason)
        if n >= request.max_tokens:
            return _ended(Finished, now, request, n, "length")
        if tokens and not request.ignore_eos and tokens[-1] in self.eos:
            return _ended(Finished, now, request, n, "eos")
        return None

    def _local(self, event: Event, owner: str, moved_at: float | None, tokens: list[int]) -> Event | None:
        """An owner's turn event as the agent should see it: on the driver's clock,
        and, after a move, the new owner's queue/admit told as one resume."""
        t = event.t + self.offsets[owner]
        if moved_at is not None:
            if isinstance(event, Queued):
                return None
            if isinstance(event, Admitted):
                return Resumed(t=t, step=event.step, turn=event.turn, agent=event.agent, priority=event.priority, slot=event.slot, paused_s=t - moved_at)
        if isinstance(event, Ended):
            return msgspec.structs.replace(event, t=t, tokens=len(tokens))
        return msgspec.structs.replace(event, t=t)

    def _lose(self, owner: str, turn_id: int, request: TurnRequest, tokens: list[int], out: Any) -> float:
        if owner in self.router.live:
            log.warning("GPU owner %s is lost; moving its turns", owner)
            self.router.lost(owner)
        self.moves += 1
        now = self.bus.now()
        paused = Preempted(t=now, step=0, turn=turn_id, agent=request.agent, priority=self._priority_of(request)(), tokens=len(tokens), reason=f"owner {owner} lost")
        self.bus.emit(msgspec.structs.replace(paused, owner=owner))
        out.send_nowait(paused)
        return now

    # ---------------------------------------------------------------- events

    async def follow(self, owner: str) -> None:
        """Merge one owner's events into the driver's stream, stamped with its name."""
        try:
            async for ref in self.handles[owner].events.remote():
                for line in (await ref).splitlines():
                    event = decode(line)
                    if isinstance(event, Event):
                        self.bus.emit(msgspec.structs.replace(event, t=event.t + self.offsets[owner], owner=owner))
        except Exception as exc:  # its turns' own streams say what became of them
            if not _owner_lost(exc):
                log.exception("lost the event stream of GPU owner %s", owner)


def _failed(now: float, turn: int, agent: str, reason: str) -> Ended:
    return Failed(t=now, step=0, turn=turn, agent=agent, priority=0, tokens=0, reason=reason)


def _ended(kind: type[Ended], now: float, request: TurnRequest, tokens: int, reason: str) -> Ended:
    return kind(t=now, step=0, turn=request.reply.turn_id, agent=request.agent, priority=request.priority, tokens=tokens, reason=reason)
