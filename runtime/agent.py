"""Agents: actors that ask the shared GPU for turns.

    class Reviewer(Agent):
        async def on_pause(self, info: PauseInfo) -> None:
            print(f"turn {info.turn} paused at token {info.at_token} for {info.by_agent}")

        @handler
        async def review(self, msg: Review) -> Verdict:
            async with self.generate([{"role": "user", "content": msg.code}], max_tokens=200) as turn:
                async for piece in turn:
                    ...                      # text as it decodes
            return Verdict(turn.text)

A turn's updates come back on its own channel, in order: queued, admitted,
tokens, paused / resumed (handed to `on_pause` / `on_resume` as they are read),
and exactly one end. Leaving the `async with` early, or the agent crashing,
cancels the turn; its slot and KV are freed at the next token boundary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ContextManager, Sequence

import anyio

from runtime.actors import Actor
from runtime.channel import EMPTY
from runtime.engine import GREEDY, Sampling, TextCodec
from runtime.errors import ActorError, TurnCancelled, TurnFailed, UsageError
from runtime.events import Admitted, Cancelled, Ended, Failed, Finished, Preempted, Queued, Resumed
from runtime.latency import felt
from runtime.messages import Token, TurnChannel, TurnRequest, turn_request_problem
from runtime.priority import BACKGROUND
from runtime.serving import MAILBOX, lift_key, serving

if TYPE_CHECKING:
    from runtime.client import GPUClient

Prompt = str | Sequence[dict[str, str]] | Sequence[int]


def check_max_tokens(agent: str, max_tokens: object) -> None:
    """For agents that take a max_tokens setting: refuse a bad one when they are
    built, not at their first turn."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise UsageError(f"agent {agent!r}: max_tokens must be an int >= 1, got {max_tokens!r}")


@dataclass(frozen=True)
class PauseInfo:
    turn: int
    at_token: int  # tokens generated before the pause
    by_turn: int | None  # the turn that took the slot (None: paused to free memory)
    by_agent: str | None
    by_priority: int | None
    t: float


@dataclass(frozen=True)
class ResumeInfo:
    turn: int
    at_token: int
    slot: int
    paused_s: float
    t: float


class Agent(Actor):
    """An actor with access to the GPU. Set `priority` to FOREGROUND for the agent
    a person is reading; the rest default to BACKGROUND."""

    def __init__(self, name: str, priority: int = BACKGROUND, **kwargs: Any) -> None:
        super().__init__(name, priority, **kwargs)
        self.gpu: GPUClient | None = None  # set by Swarm.spawn

    @property
    def tokenizer(self) -> TextCodec | None:
        return self._gpu().tokenizer

    @property
    def turn_priority(self) -> int:
        """The priority a turn started here and now runs at: the agent's own, or
        what the waiters on the request this code serves lend it (runtime.waits)."""
        if self._system is None:
            return self.priority
        return self.system.waits.lifted(self.name, serving.get())

    async def on_pause(self, info: PauseInfo) -> None:
        """A turn of this agent lost its slot at a token boundary."""

    async def on_resume(self, info: ResumeInfo) -> None:
        """A paused turn of this agent is running again."""

    def generate(
        self,
        prompt: Prompt,
        *,
        max_tokens: int = 256,
        sampling: Sampling = GREEDY,
        ignore_eos: bool = False,
    ) -> TurnHandle:
        """Start a turn: a chat (a list of {"role", "content"} messages), a single
        user message (a str), or raw token ids. Use it as `async with`."""
        return TurnHandle(self, self._encode(prompt), max_tokens, sampling, ignore_eos)

    async def complete(self, prompt: Prompt, **kwargs: Any) -> str:
        """Run a turn to its end and return its text."""
        async with self.generate(prompt, **kwargs) as turn:
            async for _ in turn:
                pass
        return turn.text

    def waiting_on(self, agent: str) -> ContextManager[object]:
        """`with self.waiting_on("aider"):` lends this agent's priority to another
        while it waits for it: one without a mailbox to ask, such as an outside
        caller of `swarm serve`, whose requests (like handlers) are then lifted.
        Raises WaitCycle if that would close a cycle."""
        return self.system.waits.waiting(self.name, agent, MAILBOX, "a wait")

    def _encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        if not isinstance(prompt, (list, tuple)):
            raise UsageError(f"agent {self.name!r}: a prompt is a str, a list of messages or a list of token ids, not {type(prompt).__name__}")
        if prompt and all(isinstance(m, dict) for m in prompt):
            if self.tokenizer is None:
                raise ActorError(f"agent {self.name!r}: this engine has no tokenizer; pass token ids")
            if not all(isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt):
                raise UsageError(f"agent {self.name!r}: each message needs a str 'role' and a str 'content'")
            return self.tokenizer.chat(list(prompt))
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
            raise UsageError(f"agent {self.name!r}: a list prompt holds messages (dicts) or token ids (ints >= 0), not a mix or strings")
        return list(prompt)

    def _gpu(self) -> GPUClient:
        if self.gpu is None:
            raise ActorError(f"agent {self.name!r} has no GPU: spawn it with Swarm.spawn")
        return self.gpu


_STOPPED = object()  # the update stream ended


class TurnHandle:
    """One turn, seen from its agent. Iterate it for text pieces; afterwards
    `tokens`, `text` and the timings say what happened."""

    def __init__(self, agent: Agent, prompt: list[int], max_tokens: int, sampling: Sampling, ignore_eos: bool) -> None:
        self.agent = agent
        self.prompt = prompt
        # Started inside a handler or a critical section: the turn serves that
        # request, and runs at whatever priority its waiters lend it.
        lifts = [lift_key(agent.name, via) for via in serving.get()]
        self._request = TurnRequest(
            agent=agent.name, priority=agent.priority, prompt=prompt, max_tokens=max_tokens, sampling=sampling, ignore_eos=ignore_eos, lifts=lifts,
        )
        # Checked here, where it is built, so a bad argument is the caller's error
        # at once (the owner checks what reaches its mailbox by the same rule).
        problem = turn_request_problem(self._request)
        if problem:
            raise UsageError(f"agent {agent.name!r}: {problem}")
        self._gpu = agent._gpu()
        self.id = self._gpu.new_turn_id()
        tokenizer = agent.tokenizer
        self._text = tokenizer.stream() if tokenizer is not None else None
        self.tokens: list[int] = []
        self.pieces: list[str] = []
        self.queued_t: float | None = None
        self.admitted_t: float | None = None
        self.token_times: list[float] = []  # when each token was decoded, on the swarm's clock
        self.ended: Ended | None = None
        self.pauses: list[PauseInfo] = []
        self.paused_s = 0.0
        self.cancel_reason = "left by its agent"  # what the event says if the turn is left early
        self._channel: TurnChannel | None = None  # made on entry: an unentered handle holds nothing

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def waited_s(self) -> float | None:
        """Request to slot: the foreground wait."""
        return None if self.admitted_t is None else self.admitted_t - self.queued_t

    @property
    def ttft_s(self) -> float | None:
        return felt(self.queued_t, self.token_times).ttft_s

    @property
    def turn_s(self) -> float | None:
        """Request to last token: how long the person waited for the whole answer."""
        return felt(self.queued_t, self.token_times).turn_s

    @property
    def itl_s(self) -> list[float]:
        """The gaps between consecutive tokens."""
        return felt(self.queued_t, self.token_times).gaps_s

    async def __aenter__(self) -> TurnHandle:
        if self._channel is not None:
            raise UsageError(f"agent {self.agent.name!r}: turn {self.id} was already started; call generate() again for another")
        self._channel = await self._gpu.submit(self.id, self._request)
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        if self.ended is not None:
            self._channel.receive.close()  # (the owner has closed the send end)
            return
        # Left early: say why, and leave the channel open until the owner ends the
        # turn and closes it. Closed now, a token sent before the cancel is taken
        # in would read as the agent having hung up, and the owner's own cancel
        # ("agent stopped listening") could overtake this one and its reason.
        with anyio.CancelScope(shield=True):
            await self._gpu.cancel(self.id, self.cancel_reason)

    def __aiter__(self) -> TurnHandle:
        return self

    async def __anext__(self) -> str:
        """The next piece of text. Ends at the turn's end; a cancelled or failed
        turn raises TurnCancelled / TurnFailed with the reason."""
        if self._channel is None:
            raise UsageError(f"agent {self.agent.name!r}: start the turn first: `async with agent.generate(...) as turn`")
        receive = self._channel.receive
        while self.ended is None:
            try:  # what is already there needs no trip through the event loop
                while (update := receive.take()) is EMPTY:
                    await receive.wait()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                update = _STOPPED
            if update is _STOPPED:
                if self.ended is None:  # the owner went away without a word
                    self.ended = Failed(t=0.0, step=0, turn=self.id, agent=self.agent.name, priority=self.agent.priority, tokens=len(self.tokens), reason="the GPU owner stopped")
                break
            # (a token, nearly every time: taken without making a coroutine)
            piece = self._push(update) if type(update) is Token else await self._take(update)
            if piece:
                return piece
        if self._text is not None and (rest := self._text.flush()):
            self.pieces.append(rest)
            return rest
        if self.ended is not None and not isinstance(self.ended, Finished):
            error = TurnCancelled if isinstance(self.ended, Cancelled) else TurnFailed
            reason = self.ended.reason
            raise error(f"turn {self.id} of agent {self.agent.name!r}: {reason}", turn=self.id, agent=self.agent.name, reason=reason)
        raise StopAsyncIteration

    def _push(self, update: Token) -> str:
        token, t = update.token, update.t
        self.tokens.append(token)
        self.token_times.append(t)
        piece = self._text.push(token) if self._text is not None else f"[{token}]"
        if piece:
            self.pieces.append(piece)
        return piece

    async def _take(self, update: Any) -> str:
        match update:
            case Token():
                return self._push(update)
            case Queued(t=t):
                self.queued_t = t
            case Admitted(t=t):
                self.admitted_t = t
            case Preempted():
                info = PauseInfo(update.turn, update.tokens, update.by_turn, update.by_agent, update.by_priority, update.t)
                self.pauses.append(info)
                await self.agent.on_pause(info)
            case Resumed():
                self.paused_s += update.paused_s
                await self.agent.on_resume(ResumeInfo(update.turn, len(self.tokens), update.slot, update.paused_s, update.t))
            case Ended():
                self.ended = update
        return ""
