"""The gateway: HTTP callers as agents of the swarm.

Each caller is an agent named by X-Swarm-Agent, else the body's `user`, else one
per connection. A request becomes one turn at the request's priority; while it
runs, the caller's base priority in the swarm's wait graph is the highest of its
requests in flight, and X-Swarm-Waits-On adds a wait edge from it to the agent
named, so priority inheritance crosses the HTTP boundary both ways: an outside
agent lends its priority to an in-process one, and an in-process agent waiting on
an outside one (`Agent.waiting_on("aider")`) lends it its own.

Admission: a background request that would wait for a slot behind `max_queue`
others already waiting is refused (429), one that finds a slot free never is, nor
is a foreground one; once closing, every new request is refused (503).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import IO, Any

import anyio
import msgspec

from runtime.actors.serving import MAILBOX, on_behalf
from runtime.agent import Agent, TurnHandle
from runtime.errors import RequestError, SlotswarmError, TurnCancelled, TurnError, UsageError, WaitCycle
from runtime.events.files import open_private
from runtime.scheduling.priority import BACKGROUND, FOREGROUND
from swarm.api import Swarm
from swarm.server.protocol import TurnSpec, check_agent_name, parse_priority
from swarm.server.turn import ServedTurn


class Caller(msgspec.Struct, frozen=True):
    agent: str
    priority: int
    waits_on: str | None = None

    @property
    def klass(self) -> str:
        return "foreground" if self.priority >= FOREGROUND else "background"


class _Outside(Agent):
    """An HTTP caller as the GPU owner sees it: a name and a priority. It is never
    spawned (it has no mailbox): its turns go to the owner like any agent's."""


class Gateway:
    def __init__(self, swarm: Swarm, *, model_id: str, max_queue: int | None = None, log_prompts: str | Path | None = None) -> None:
        self.swarm = swarm
        self.model_id = model_id
        self.max_queue = max_queue
        self.tokenizer = swarm.client.tokenizer
        self.context = swarm.config.max_context or math.inf
        self.clock: Callable[[], float] = swarm.bus.now
        self.metrics: Any = None  # swarm.server.metrics.Metrics, once attached
        self.turns: dict[int, ServedTurn] = {}
        self.closing = False
        self.closed = anyio.Event()  # set once shutdown has ended every turn: event streams end
        self.hurry = anyio.Event()  # set to cut the grace period short
        self._changed = anyio.Event()
        self._in_flight: dict[str, list[int]] = {}  # agent -> priorities of its requests in flight
        # Work that scales with a request's size (decoding its body, tokenizing) runs in
        # worker threads, two at a time: it is CPU work, and the owner's step thread needs a core.
        self.workers = anyio.CapacityLimiter(2)
        self._longest_token = _longest_token(self.tokenizer)
        self._prompt_log: IO[str] | None = open_private(log_prompts, "a", buffering=1, encoding="utf-8") if log_prompts else None

    # --------------------------------------------------------------- callers

    def caller(self, headers: Any, spec: TurnSpec, connection: tuple[str, int] | None) -> Caller:
        name = headers.get("x-swarm-agent")
        if name is not None:
            name = check_agent_name(name.strip(), "X-Swarm-Agent")
        elif spec.user is not None:
            name = spec.user
        else:
            host, port = connection or ("unknown", 0)
            name = f"conn-{host}:{port}"
        if name in self.swarm.system.names():
            raise RequestError(
                f"agent name {name!r} belongs to an in-process agent of this swarm; choose another",
                param="X-Swarm-Agent",
                code="invalid_agent",
            )
        header = parse_priority(headers.get("x-swarm-priority"))
        if header is not None and spec.priority is not None and header != spec.priority:
            raise RequestError(
                f"the body's priority ({-spec.priority}, lower first as in vLLM) and X-Swarm-Priority ({header}, higher first) disagree",
                param="priority",
                code="invalid_priority",
            )
        priority = spec.priority if spec.priority is not None else header if header is not None else BACKGROUND
        waits_on = headers.get("x-swarm-waits-on")
        if waits_on is not None:
            waits_on = check_agent_name(waits_on.strip(), "X-Swarm-Waits-On")
        return Caller(name, priority, waits_on)

    # ----------------------------------------------------------------- turns

    async def prompt_ids(self, spec: TurnSpec) -> tuple[list[int], int]:
        """The prompt's token ids and the max_tokens to run, or a 400. Tokenizing and
        the chat template scale with the body, so they run in a worker thread: this
        event loop drives the GPU owner, and with it every other stream."""
        if self.tokenizer is None:
            raise RequestError("this engine has no tokenizer", status=503, type="server_error")
        pool = self.swarm.owner.scheduler.pool
        limit = min(self.context, pool.num_blocks * pool.block_size)  # positions a prompt must stay under
        try:
            ids = await anyio.to_thread.run_sync(self._tokenize, spec, limit, limiter=self.workers)
        except SlotswarmError as exc:
            if isinstance(exc, RequestError):
                raise
            raise RequestError(str(exc), param="messages") from None
        if not ids:
            raise RequestError("the prompt is empty", param="prompt")
        room = self.context - len(ids)
        if room < 1 or (spec.max_tokens is not None and spec.max_tokens > room):
            asked = f" plus {spec.max_tokens} to generate" if spec.max_tokens is not None else ""
            raise self._too_long(spec, f"the prompt is {len(ids)}{asked}")
        max_tokens = spec.max_tokens if spec.max_tokens is not None else int(room)
        if pool.blocks_for(len(ids) + max_tokens) > pool.num_blocks:
            raise RequestError(
                f"{len(ids)} + {max_tokens} tokens need more KV memory than this server has "
                f"({pool.num_blocks * pool.block_size} positions)",
                param="max_tokens",
                code="context_length_exceeded",
            )
        return ids, max_tokens

    def _tokenize(self, spec: TurnSpec, limit: float) -> list[int]:
        """In a worker thread. A text too long for `limit` positions even at the
        longest token per position is refused before any work on it."""
        if spec.messages is not None:
            # (an assistant message that only calls tools has no content)
            self._check_size(spec, sum(len((m["content"] or "").encode()) for m in spec.messages), limit)
            if spec.tools.tools or any(m.get("tool_calls") or m["role"] == "tool" for m in spec.messages):
                return self.tokenizer.chat(spec.messages, tools=spec.tools.tools)
            return self.tokenizer.chat(spec.messages)
        if spec.text is not None:
            self._check_size(spec, len(spec.text.encode()), limit)
            return self.tokenizer.encode(spec.text)
        ids = spec.token_ids or []
        vocab = self.tokenizer.vocab_size
        if any(not 0 <= t < vocab for t in ids):
            raise RequestError(f"token ids must be in [0, {vocab})", param="prompt")
        return ids

    def _check_size(self, spec: TurnSpec, size: int, limit: float) -> None:
        at_least = -(-size // self._longest_token) if self._longest_token else 0
        if at_least >= limit:
            raise RequestError(
                f"the prompt's text is {size} bytes, at least {at_least} tokens; this server takes prompts under {int(limit)}",
                param="messages" if spec.kind == "chat" else "prompt",
                code="context_length_exceeded",
            )

    def _too_long(self, spec: TurnSpec, what: str) -> RequestError:
        return RequestError(
            f"this model's context is {self.context} tokens; {what}",
            param="messages" if spec.kind == "chat" else "prompt",
            code="context_length_exceeded",
        )

    def waiting(self) -> int:
        """Requests that wait for their first slot: those not admitted yet, past the
        slots free for them (a request that will take a free slot does not wait)."""
        scheduler = self.swarm.owner.scheduler
        unadmitted = 0
        for turn_id, served in self.turns.items():
            turn = scheduler.turns.get(turn_id)  # None: not taken in by the owner yet, or ended
            if served.handle.ended is None and (turn.admitted_at is None if turn is not None else served.handle.admitted_t is None):
                unadmitted += 1
        return unadmitted - (scheduler.config.slots - len(scheduler.running))

    @asynccontextmanager
    async def turn(self, caller: Caller, spec: TurnSpec, arrived: float) -> AsyncIterator[ServedTurn]:
        if self.closing:
            raise RequestError("the server is shutting down", status=503, type="server_error", code="shutting_down")
        prompt, max_tokens = await self.prompt_ids(spec)
        try:  # (the tools' grammar scales with the body: written in a worker thread)
            constraint = await anyio.to_thread.run_sync(spec.tools.constraint, self.tokenizer.tool_format, limiter=self.workers)
        except UsageError as exc:
            raise RequestError(str(exc), param="tools" if spec.tools.may_call else "response_format", code="unsupported_schema") from None
        if self.max_queue is not None and caller.priority < FOREGROUND and (waiting := self.waiting()) >= self.max_queue:
            raise RequestError(
                f"{waiting} requests are already waiting for a slot (--max-queue {self.max_queue}); retry later",
                status=429,
                type="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": "1"},
            )
        waits = self.swarm.system.waits
        self._in_flight.setdefault(caller.agent, []).append(caller.priority)
        waits.set_base(caller.agent, max(self._in_flight[caller.agent]))
        edge = None
        try:
            if caller.waits_on is not None:
                try:
                    edge = waits.wait(caller.agent, caller.waits_on, MAILBOX, f"HTTP request of {caller.agent}")
                except WaitCycle as exc:
                    raise RequestError(str(exc), param="X-Swarm-Waits-On", code="wait_cycle") from None
            agent = _Outside(caller.agent, caller.priority)
            agent.gpu = self.swarm.client
            try:
                # An outside caller is all request: whoever waits on it waits on this
                # turn, so the turn carries the caller's mailbox lift.
                with on_behalf(MAILBOX):
                    handle = agent.generate(
                        prompt, max_tokens=max_tokens, sampling=spec.sampling, ignore_eos=spec.ignore_eos, constraint=constraint
                    )
            except UsageError as exc:
                raise RequestError(str(exc)) from None
            served = ServedTurn(self, caller, handle, spec, arrived)
            async with AsyncExitStack() as stack:
                try:
                    await stack.enter_async_context(handle)
                except TurnError as exc:  # the GPU owner has stopped
                    raise RequestError(str(exc), status=503, type="server_error", code="shutting_down") from None
                except UsageError as exc:  # a schema the grammar engine cannot follow, named
                    param = "tools" if spec.tools.may_call else "response_format"
                    raise RequestError(str(exc), param=param, code="unsupported_schema") from None
                self._track(handle.id, served)
                try:
                    yield served
                finally:
                    self._untrack(handle.id)
                    self._log(served)
        finally:
            mine = self._in_flight[caller.agent]
            mine.remove(caller.priority)
            waits.set_base(caller.agent, max(mine, default=BACKGROUND))
            if not mine:
                del self._in_flight[caller.agent]
            if edge is not None:
                waits.release(edge)
                self._forget_if_gone(edge.holder)  # a caller it waited on may have gone before it
            self._forget_if_gone(caller.agent)

    def _forget_if_gone(self, agent: str) -> None:
        """A caller with no request in flight leaves nothing in the wait graph
        (`forget` keeps it while someone still waits on it). In-process agents
        keep theirs: they are alive."""
        if agent not in self._in_flight and agent not in self.swarm.system.names():
            self.swarm.system.waits.forget(agent)

    def ended_early(self, handle: TurnHandle, exc: Exception) -> RequestError:
        reason = handle.ended.reason if handle.ended else str(exc)
        if isinstance(exc, TurnCancelled):
            return RequestError(f"the turn was cancelled: {reason}", status=503, type="server_error", code="cancelled")
        return RequestError(f"the turn failed: {reason}", status=503, type="server_error", code="turn_failed")

    def _track(self, turn_id: int, served: ServedTurn) -> None:
        self.turns[turn_id] = served
        self._notify()

    def _untrack(self, turn_id: int) -> None:
        self.turns.pop(turn_id, None)
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def _log(self, served: ServedTurn) -> None:
        if self._prompt_log is None:
            return
        spec = served.spec
        record = {
            "turn": served.handle.id,
            "agent": served.caller.agent,
            "priority": served.caller.priority,
            "prompt": spec.messages if spec.messages is not None else spec.text if spec.text is not None else spec.token_ids,
            "completion": "".join(served.text),
            "finish_reason": served.finish_reason,
            "usage": served.usage(),
        }
        self._prompt_log.write(msgspec.json.encode(record).decode() + "\n")

    # -------------------------------------------------------------- shutdown

    async def shutdown(self, grace_s: float) -> None:
        """Refuse new requests, give running turns `grace_s` to finish, then cancel
        the rest (each ends in turn.cancelled; its client gets an error)."""
        self.closing = True
        with anyio.move_on_after(grace_s):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_cancel_when, self.hurry, tg.cancel_scope)
                while self.turns:
                    await self._changed.wait()
                tg.cancel_scope.cancel()
        for turn_id, served in list(self.turns.items()):
            served.handle.cancel_reason = "server shutting down"
            await self.swarm.client.cancel(turn_id, "server shutting down")
        while self.turns:
            await self._changed.wait()
        self.closed.set()
        if self._prompt_log is not None:
            self._prompt_log.close()
            self._prompt_log = None


def _longest_token(tokenizer: Any) -> int | None:
    """The most bytes of text one token stands for: a text of n bytes is at least
    n / this many tokens (None: the tokenizer does not say)."""
    if tokenizer is None or not hasattr(tokenizer, "token_bytes"):
        return None
    return max((len(tokenizer.token_bytes(i)) for i in range(tokenizer.vocab_size)), default=0) or None


async def _cancel_when(event: anyio.Event, scope: anyio.CancelScope) -> None:
    await event.wait()
    scope.cancel()
