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

Every turn ends in exactly one terminal event in the merged log, however its
owners fare (`TurnEnds`).
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable
from typing import Any

import anyio
import msgspec

from runtime.actors.serving import lift_key
from runtime.errors import ConfigError, TurnCancelled
from runtime.events.bus import EventBus
from runtime.events.kinds import Admitted, Cancelled, Ended, Event, Failed, Finished, Preempted, Queued, Resumed, decode
from runtime.owner.client import GPUClient
from runtime.owner.messages import Token, TurnChannel, TurnRequest, turn_request_problem
from swarm.cluster.placement import Router

log = logging.getLogger(__name__)

LOST = "owner lost"  # told to a turn's pump when its owner's stream breaks
GONE = "owner stopped"  # and when it ends (the owner stopped without ending it)


def _owner_lost(exc: BaseException) -> bool:
    import ray.exceptions

    return isinstance(exc, (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError))


class ClusterGPU(GPUClient):
    """The GPU client (runtime.owner.client.GPUClient) of owners spread over Ray."""

    def __init__(
        self,
        handles: dict[str, Any],
        offsets: dict[str, float],
        router: Router,
        bus: EventBus,
        tokenizer: Any,
        tasks: anyio.abc.TaskGroup,
        lent: Callable[[str], int | None],
        constraints: Any = None,
    ) -> None:
        self.handles = handles  # owner name -> Ray actor handle
        self.offsets = offsets  # owner name -> its clock zero minus ours, in seconds
        self.router = router
        self.now = bus.now
        self.bus = bus
        self.tokenizer = tokenizer
        self.constraints = constraints  # checks a turn's constraint before it is queued
        self.closed = False
        self.moves = 0  # turns moved off a lost owner
        self._tasks = tasks
        self._ids = itertools.count(1)
        self._lent = lent  # lift key -> the priority lent under it, if any: the wait graph's, asked, not copied
        self._agents: dict[int, str] = {}  # live turn -> its agent
        self._cancelled: dict[int, str] = {}  # live turn -> why its agent cancelled it
        self._inboxes: dict[int, tuple[str, Any]] = {}  # turn -> (its owner now, its pump's inbox)
        self.ends = TurnEnds(bus)
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
        """Run one turn wherever it can run, moving it when its owner is lost, until
        it ends; the agent is told everything, and the end exactly once."""
        turn_id, out = request.reply.turn_id, request.reply.send
        tokens: list[int] = []  # generated so far, on whichever owners
        moved_at: float | None = None  # when this turn lost its owner, until it resumes
        owner = None
        placed = False  # started on an owner, which logged it as queued
        told_end = False
        inbox, updates = anyio.create_memory_object_stream[Any](math.inf)

        def tell(update: Any) -> None:
            nonlocal told_end
            told_end = told_end or isinstance(update, Ended)
            try:
                out.send_nowait(update)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                # The agent stopped listening before its cancel could reach an
                # owner: cancel the turn, and go on pumping until it ends.
                if turn_id not in self._cancelled:
                    self._cancelled[turn_id] = "agent stopped listening"
                    if owner in self.router.live:
                        self.handles[owner].cancel.remote(turn_id, "agent stopped listening")

        def end_here(end: Ended) -> None:
            # An end the driver decides; but if the lost owner's own end reached
            # the log first, that is the end, and the one the agent hears.
            if not placed:  # no owner ever queued it: the log shows it asked, and ended
                self.bus.emit(
                    Queued(t=request.t, step=0, turn=turn_id, agent=request.agent, priority=request.priority, tokens=len(request.prompt))
                )
            logged = self.ends.decided_here(end)
            tell(end if logged is None else _as_told(logged, len(tokens)))

        def lose() -> bool:
            """The owner is lost: True if it had ended the turn after all (and the
            agent is told so), else the turn is set to move."""
            nonlocal moved_at
            if (logged := self.ends.owner_lost(owner, turn_id)) is not None:
                self._owner_gone(owner)
                tell(_as_told(logged, len(tokens)))
                return True
            moved_at = self._lose(owner, turn_id, request, tokens, tell)
            return False

        try:
            while (settled := self._settled(request, tokens)) is None:
                owner = self.router.owner_for(request.agent)
                self.router.started(turn_id, owner, self._priority_of(request))
                self._inboxes[turn_id] = (owner, inbox)
                # On the owner's clock: its wait starts when the agent asked, crossing included.
                asked = (request.t if moved_at is None else moved_at) - self.offsets[owner]
                remote = msgspec.structs.replace(
                    request,
                    reply=None,
                    prompt=request.prompt + tokens,
                    max_tokens=request.max_tokens - len(tokens),
                    prior_output=request.prior_output + len(tokens),
                    t=asked,
                )
                lifts = {key: p for key in request.lifts if (p := self._lent(key)) is not None}
                placed = True
                try:
                    await self.handles[owner].start.remote(turn_id, remote, lifts)
                except Exception as exc:
                    if not _owner_lost(exc):
                        raise
                    if lose():
                        return
                    continue
                async for update in updates:
                    if update == GONE:  # the stream ended without an end: the owner stopped
                        end_here(_ended(Failed, self.now(), request, len(tokens), GONE))
                        return
                    if update == LOST:
                        if lose():
                            return
                        break
                    if isinstance(update, Token):
                        tokens.append(update.token)
                        tell(msgspec.structs.replace(update, t=update.t + self.offsets[owner]))
                        continue
                    local = self._local(update, owner, moved_at, tokens)
                    if isinstance(update, Ended):
                        self.ends.pump_heard(msgspec.structs.replace(update, t=local.t, owner=owner))
                        tell(local)
                        return
                    if local is not None:
                        moved_at = None if isinstance(local, Resumed) else moved_at
                        tell(local)
            end_here(settled)
        except ConfigError as exc:  # no owner left to run it
            end_here(_ended(Failed, self.now(), request, len(tokens), str(exc)))
        except BaseException as exc:
            if not told_end:  # the cluster stopped before an owner ended it, or a fault here
                if isinstance(exc, anyio.get_cancelled_exc_class()):
                    end_here(_ended(Cancelled, self.now(), request, len(tokens), "the cluster stopped"))
                else:
                    end_here(_ended(Failed, self.now(), request, len(tokens), f"{type(exc).__name__}: {exc}"))
            raise
        finally:
            self.router.ended(turn_id)
            self.ends.forget(turn_id)
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
            for where, inbox in list(self._inboxes.values()):
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
                return Resumed(
                    t=t,
                    step=event.step,
                    turn=event.turn,
                    agent=event.agent,
                    priority=event.priority,
                    slot=event.slot,
                    paused_s=t - moved_at,
                )
        if isinstance(event, Ended):
            return msgspec.structs.replace(event, t=t, tokens=len(tokens))
        return msgspec.structs.replace(event, t=t)

    def _owner_gone(self, owner: str) -> None:
        if owner in self.router.live:
            log.warning("GPU owner %s is lost; moving its turns", owner)
            self.router.lost(owner)

    def _lose(self, owner: str, turn_id: int, request: TurnRequest, tokens: list[int], tell: Callable[[Any], None]) -> float:
        self._owner_gone(owner)
        self.moves += 1
        now = self.bus.now()
        paused = Preempted(
            t=now,
            step=0,
            turn=turn_id,
            agent=request.agent,
            priority=self._priority_of(request)(),
            tokens=len(tokens),
            reason=f"owner {owner} lost",
        )
        self.bus.emit(msgspec.structs.replace(paused, owner=owner))
        tell(paused)
        return now

    # ---------------------------------------------------------------- events

    async def follow(self, owner: str) -> None:
        """Merge one owner's events into the driver's stream, stamped with its name."""
        try:
            async for ref in self.handles[owner].events.remote():
                for line in (await ref).splitlines():
                    event = decode(line)
                    if isinstance(event, Ended):
                        pumping = self._inboxes.get(event.turn, (None,))[0] == owner
                        self.ends.owner_said(msgspec.structs.replace(event, t=event.t + self.offsets[owner], owner=owner), pumping)
                    elif isinstance(event, Event):
                        self.bus.emit(msgspec.structs.replace(event, t=event.t + self.offsets[owner], owner=owner))
        except Exception as exc:  # its turns' own streams say what became of them
            if not _owner_lost(exc):
                log.exception("lost the event stream of GPU owner %s", owner)
        finally:
            self.ends.owner_done(owner)


class TurnEnds:
    """Puts each turn's end in the merged log exactly once.

    An owner's end of a turn reaches the driver twice: in the owner's event
    stream (`follow`, which logs it, in the owner's order) and in the turn's own
    updates (its pump, which tells the agent). A dying owner can take either with
    it. So an end the pump hears first is logged when the event stream brings it,
    or when that stream ends without it; an end the event stream brings first is
    the turn's end even if its owner is lost before the pump hears it; and once the
    pump gives up on a lost owner, that owner's word on the turn no longer counts.
    Ends no owner made (a turn settled or failed by the driver) are logged at once.
    Every record is dropped when its turn's pump or its owner's stream ends."""

    def __init__(self, bus: EventBus) -> None:
        self.bus = bus
        self._awaited: dict[int, Ended] = {}  # heard by the pump, not yet in the log
        self._logged: dict[int, Ended] = {}  # in the log, not yet heard by the pump
        self._disowned: dict[str, set[int]] = {}  # owner -> turns the pump gave up on it
        self._done: set[str] = set()  # owners whose event streams have ended

    # ---- from an owner's event stream

    def owner_said(self, end: Ended, pumping: bool) -> None:
        """An end in `end.owner`'s event stream; `pumping`: the turn's pump still
        waits on that owner."""
        if end.turn in self._disowned.get(end.owner, ()):
            return  # moved off (or settled without) that owner: its end is logged elsewhere
        if self._awaited.pop(end.turn, None) is None and pumping:
            self._logged[end.turn] = end
        self.bus.emit(end)

    def owner_done(self, owner: str) -> None:
        """The owner's event stream ended (it stopped, or died): log the ends
        it told the pumps but took with it."""
        self._done.add(owner)
        self._disowned.pop(owner, None)
        for turn, end in list(self._awaited.items()):
            if end.owner == owner:
                del self._awaited[turn]
                self.bus.emit(end)

    # ---- from a turn's pump

    def pump_heard(self, end: Ended) -> None:
        """The turn's owner ended it (`end` stamped as the log has it)."""
        if self._logged.pop(end.turn, None) is None:
            if end.owner in self._done:
                self.bus.emit(end)  # its stream is over: it will never bring this
            else:
                self._awaited[end.turn] = end

    def owner_lost(self, owner: str, turn: int) -> Ended | None:
        """The turn's owner is lost before the pump heard its end: the end, if its
        event stream brought one (the turn is over), else None and the owner is
        disowned for the turn."""
        if (end := self._logged.pop(turn, None)) is not None:
            return end
        if owner not in self._done:
            self._disowned.setdefault(owner, set()).add(turn)
        return None

    def decided_here(self, end: Ended) -> Ended | None:
        """An end the driver made; logs it, unless an owner's end is logged
        already, which is returned."""
        if (logged := self._logged.pop(end.turn, None)) is not None:
            return logged
        self.bus.emit(end)
        return None

    def forget(self, turn: int) -> None:
        self._logged.pop(turn, None)


def _as_told(logged: Ended, tokens: int) -> Ended:
    """A logged end as the turn's agent hears it."""
    return msgspec.structs.replace(logged, owner=None, tokens=tokens)


def _failed(now: float, turn: int, agent: str, reason: str) -> Ended:
    return Failed(t=now, step=0, turn=turn, agent=agent, priority=0, tokens=0, reason=reason)


def _ended(kind: type[Ended], now: float, request: TurnRequest, tokens: int, reason: str) -> Ended:
    return kind(t=now, step=0, turn=request.reply.turn_id, agent=request.agent, priority=request.priority, tokens=tokens, reason=reason)
