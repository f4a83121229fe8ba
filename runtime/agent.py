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

Typed answers and tools:

    finding = await self.complete(prompt, schema=Finding)     # a Finding (msgspec Struct)
    word = await self.complete(prompt, choices=["yes", "no"])
    answer = await self.use_tools(prompt, tools=[self.read_file], max_rounds=3)

The decoding is held to the schema (or regex, grammar, choices, tool calls), so
the answer parses whatever the model: runtime.scheduling.constraints, runtime.toolcalls.
"""

from __future__ import annotations

import json
import reprlib
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from runtime.actors.actor import Actor
from runtime.actors.channel import EMPTY
from runtime.actors.serving import MAILBOX, lift_key, serving
from runtime.errors import ActorError, TurnCancelled, TurnFailed, UsageError
from runtime.events.kinds import Admitted, Cancelled, Ended, Failed, Finished, Preempted, Queued, Resumed, ToolCalled
from runtime.events.latency import felt
from runtime.owner.messages import Token, TurnChannel, TurnRequest, turn_request_problem
from runtime.scheduling.constraints import Choices, Constraint, Grammar, JsonSchema, Regex, check_constraint
from runtime.scheduling.priority import BACKGROUND
from runtime.scheduling.work import GREEDY, Sampling, TextCodec
from runtime.toolcalls import HERMES, ToolCall, ToolCallFormat, ToolChoice
from runtime.tools import Tool, ToolOutcome, ToolSpec, struct_schema, tools_by_name, unknown_tool

if TYPE_CHECKING:
    from runtime.owner.client import GPUClient

Prompt = str | Sequence[dict[str, Any]] | Sequence[int]


def _constraint_from(*, schema: Any, regex: str | None, grammar: str | None, choices: Sequence[str] | None) -> list[Constraint]:
    """The constraints the shorthand keywords of `generate` ask for."""
    found: list[Constraint] = []
    if schema is not None:
        try:
            text = json.dumps(schema if isinstance(schema, dict) else struct_schema(schema))
        except (TypeError, ValueError) as exc:  # (a dict that holds itself is a ValueError)
            raise UsageError(f"schema {reprlib.repr(schema)} has no JSON Schema ({exc})") from None
        except RecursionError:
            raise UsageError(f"schema {reprlib.repr(schema)} nests too deeply") from None
        found.append(JsonSchema(text))
    if regex is not None:
        found.append(Regex(regex))
    if grammar is not None:
        found.append(Grammar(grammar))
    if choices is not None:
        if isinstance(choices, str):
            raise UsageError("choices is a list of strings, not one string")
        found.append(Choices(tuple(choices)))
    return found


def _round_choice(tool_choice: ToolChoice, round_: int, max_rounds: int) -> ToolChoice:
    """The tool choice of one round of a tool loop: the caller's for the first,
    "auto" after it (a required or named call would never let the model answer),
    and "none" for the last, when the rounds of calls are spent."""
    if round_ == max_rounds or tool_choice == "none":
        return "none"
    return tool_choice if round_ == 0 else "auto"


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
        what the waiters on the request this code serves lend it (runtime.actors.waits)."""
        if self._system is None:
            return self.priority
        return self.system.waits.lifted(self.name, serving.get())

    async def on_pause(self, info: PauseInfo) -> None:
        """A turn of this agent lost its slot at a token boundary."""

    async def on_resume(self, info: ResumeInfo) -> None:
        """A paused turn of this agent is running again."""

    async def on_turn_end(self, turn: TurnHandle) -> None:
        """A turn of this agent finished (it was not cancelled and did not fail),
        as its `async with` block is left: `turn` says how it went."""

    def generate(
        self,
        prompt: Prompt,
        *,
        max_tokens: int = 256,
        sampling: Sampling = GREEDY,
        ignore_eos: bool = False,
        constraint: Constraint | None = None,
        schema: Any = None,
        regex: str | None = None,
        grammar: str | None = None,
        choices: Sequence[str] | None = None,
        tools: Sequence[Callable | Tool | ToolSpec] = (),
        tool_choice: ToolChoice = "auto",
        parallel_tool_calls: bool = True,
    ) -> TurnHandle:
        """Start a turn: a chat (a list of {"role", "content"} messages), a single
        user message (a str), or raw token ids. Use it as `async with`.

        Its output may be held to a `constraint` (runtime.scheduling.constraints), or, said
        shorter, to a `schema` (a type msgspec describes, e.g. a Struct, or a JSON
        Schema dict), a `regex`, a Lark `grammar` or one of `choices`: one the
        engine cannot follow is a UsageError on entry, before the turn is queued.
        With `tools` the prompt lists them and the output is held to calls of
        them (runtime.toolcalls) as `tool_choice` says; `turn.text` then holds
        the calls, which `self.tool_format.parse` reads."""
        if not isinstance(tool_choice, str) or not isinstance(parallel_tool_calls, bool):
            raise UsageError(f"agent {self.name!r}: tool_choice is auto, none, required or a tool's name, and parallel_tool_calls a bool")
        specs = [t if isinstance(t, ToolSpec) else Tool.of(t).spec for t in tools]
        shorthand = _constraint_from(schema=schema, regex=regex, grammar=grammar, choices=choices)
        if specs:
            tool_grammar = self.tool_format.grammar(specs, tool_choice, parallel=parallel_tool_calls)
            shorthand = (shorthand or []) + ([Grammar(tool_grammar)] if tool_grammar is not None else [])
        if shorthand:
            if constraint is not None or len(shorthand) > 1:
                raise UsageError(f"agent {self.name!r}: a turn takes one constraint (constraint, schema, regex, grammar, choices or tools)")
            constraint = shorthand[0]
        return TurnHandle(self, self._encoder(prompt, specs), max_tokens, sampling, ignore_eos, constraint)

    async def complete(self, prompt: Prompt, *, schema: Any = None, **kwargs: Any) -> Any:
        """Run a turn to its end and return its text; with a `schema`, the answer
        decoded to it (a Struct for a Struct type; JSON values for a schema dict)."""
        async with self.generate(prompt, schema=schema, **kwargs) as turn:
            async for _ in turn:
                pass
        if schema is None:
            return turn.text
        try:
            return msgspec.json.decode(turn.text, type=Any if isinstance(schema, dict) else schema)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            # Held to the schema, the text is valid so far: it only stops short when
            # the turn ran out of tokens (or of context) before the JSON closed.
            reason = f"the answer ended ({turn.ended.reason}) before it was whole JSON of its schema: {exc}"
            raise TurnFailed(f"turn {turn.id} of agent {self.name!r}: {reason}", turn=turn.id, agent=self.name, reason=reason) from None

    @property
    def tool_format(self) -> ToolCallFormat:
        """How this agent's model writes tool calls."""
        return getattr(self.tokenizer, "tool_format", HERMES)

    async def use_tools(
        self,
        prompt: Prompt,
        *,
        tools: Sequence[Callable | Tool],
        max_rounds: int = 4,
        tool_choice: ToolChoice = "auto",
        parallel_tool_calls: bool = True,
        tool_timeout_s: float | None = 60.0,
        max_tokens: int = 256,
        sampling: Sampling = GREEDY,
        transcript: list[dict[str, Any]] | None = None,
    ) -> str:
        """Let the model call `tools` until it answers; return the answer. Pass a
        `transcript` list to get the whole conversation in it: the prompt's
        messages, each round's calls and the tools' results.

        Each round is a turn of its own: the model's calls are parsed, the tools
        run (the turn has ended, so its slot is free for others meanwhile), and
        their results join the conversation for the next round. A tool that
        raises, times out (`tool_timeout_s`, unless the tool sets its own) or is
        given arguments that do not fit answers with the error instead. After
        `max_rounds` rounds of calls the model is asked to answer without tools.
        `tool_choice` binds the first round only (`required` or a tool's name
        would otherwise never let it answer)."""
        if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 1:
            raise UsageError(f"agent {self.name!r}: max_rounds must be an int >= 1, got {max_rounds!r}")
        by_name = tools_by_name(list(tools))
        specs = [t.spec for t in by_name.values()]
        messages = transcript if transcript is not None else []
        messages += self._messages(prompt)
        for round_ in range(max_rounds + 1):
            choice = _round_choice(tool_choice, round_, max_rounds)
            async with self.generate(
                messages,
                tools=specs,
                tool_choice=choice,
                parallel_tool_calls=parallel_tool_calls,
                max_tokens=max_tokens,
                sampling=sampling,
            ) as turn:
                async for _ in turn:
                    pass
            content, calls = self.tool_format.parse(turn.text)
            if not calls or choice == "none":
                return turn.text.strip()
            messages.append({"role": "assistant", "content": content or None, "tool_calls": [c.as_openai() for c in calls]})
            outcomes = await self.run_tool_calls(calls, by_name, timeout_s=tool_timeout_s)
            messages += [
                {"role": "tool", "tool_call_id": c.id, "name": c.name, "content": o.text} for c, o in zip(calls, outcomes, strict=False)
            ]
        raise AssertionError("unreachable: the last round takes no calls")

    async def run_tool_calls(
        self, calls: Sequence[ToolCall], tools: Mapping[str, Tool], *, timeout_s: float | None = 60.0
    ) -> list[ToolOutcome]:
        """Run a round's calls side by side; each outcome in its call's place, and
        one `tool.called` event each (name, duration, status: never arguments or results)."""
        outcomes: list[ToolOutcome | None] = [None] * len(calls)

        async def run(i: int, call: ToolCall) -> None:
            known = tools.get(call.name)
            outcome = unknown_tool(call.name, list(tools)) if known is None else await known.run(call.arguments, timeout_s=timeout_s)
            outcomes[i] = outcome
            self.tell_tool_called(call.name, outcome.duration_s, outcome.status)

        async with anyio.create_task_group() as group:
            for i, call in enumerate(calls):
                group.start_soon(run, i, call)
        return [o for o in outcomes if o is not None]

    def tell_tool_called(self, tool: str, duration_s: float, status: str) -> None:
        """Log that this agent ran a tool (a `tool.called` event: its name, time
        and status; never what it was given or answered)."""
        if self._system is not None:
            bus = self.system.bus
            bus.emit(
                ToolCalled(
                    t=bus.now(),
                    step=self.system.step_source(),
                    agent=self.name,
                    tool=tool,
                    duration_s=round(duration_s, 6),
                    status=status,
                )
            )

    def waiting_on(self, agent: str) -> AbstractContextManager[object]:
        """`with self.waiting_on("aider"):` lends this agent's priority to another
        while it waits for it: one without a mailbox to ask, such as an outside
        caller of `swarm serve`, whose requests (like handlers) are then lifted.
        Raises WaitCycle if that would close a cycle."""
        return self.system.waits.waiting(self.name, agent, MAILBOX, "a wait")

    def _messages(self, prompt: Prompt) -> list[dict[str, Any]]:
        if isinstance(prompt, str):
            return [{"role": "user", "content": prompt}]
        if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, dict) for m in prompt):
            return [dict(m) for m in prompt]
        raise UsageError(f"agent {self.name!r}: a conversation is a str or a list of messages, not {type(prompt).__name__}")

    def _encoder(self, prompt: Prompt, tools: Sequence[ToolSpec] = ()) -> list[int] | Chat:
        """The prompt's token ids, or for a chat what makes them. The
        prompt's shape is checked here, so a bad one is the caller's error at
        once; the chat template and the tokenizer run when the turn is entered,
        off the event loop when the text is long (TurnHandle.__aenter__)."""
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        if not isinstance(prompt, (list, tuple)):
            raise UsageError(
                f"agent {self.name!r}: a prompt is a str, a list of messages or a list of token ids, not {type(prompt).__name__}"
            )
        if prompt and all(isinstance(m, dict) for m in prompt):
            tokenizer = self.tokenizer
            if tokenizer is None:
                raise ActorError(f"agent {self.name!r}: this engine has no tokenizer; pass token ids")
            for m in prompt:
                # An assistant message that calls tools may have no text.
                text_ok = isinstance(m.get("content"), str) or (m.get("content") is None and m.get("tool_calls"))
                if not isinstance(m.get("role"), str) or not text_ok:
                    raise UsageError(f"agent {self.name!r}: each message needs a str 'role' and a str 'content'")
            return Chat(tokenizer, list(prompt), tuple(tools))
        if tools:
            raise UsageError(f"agent {self.name!r}: tools need a chat prompt (messages or a str), not token ids")
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
            raise UsageError(f"agent {self.name!r}: a list prompt holds messages (dicts) or token ids (ints >= 0), not a mix or strings")
        return list(prompt)

    def _gpu(self) -> GPUClient:
        if self.gpu is None:
            raise ActorError(f"agent {self.name!r} has no GPU: spawn it with Swarm.spawn")
        return self.gpu


@dataclass(frozen=True)
class Chat:
    """A chat prompt, checked and not yet tokenized."""

    tokenizer: TextCodec
    messages: list[dict[str, Any]]
    tools: tuple[ToolSpec, ...] = ()

    # Past this much text, the template and the tokenizer run in a worker thread
    # (they scale with the text and would stall every other turn's tokens);
    # below it the hop to a thread costs more than the work.
    INLINE_CHARS = 4096

    async def encode(self) -> list[int]:
        if sum(len(m.get("content") or "") for m in self.messages) > self.INLINE_CHARS:
            return await anyio.to_thread.run_sync(self.tokens)
        return self.tokens()

    def tokens(self) -> list[int]:
        if self.tools or any(m.get("tool_calls") or m.get("role") == "tool" for m in self.messages):
            return self.tokenizer.chat(self.messages, tools=self.tools)
        return self.tokenizer.chat(self.messages)


_STOPPED = object()  # the update stream ended


# anyio delivers a cancellation to a task only while the future it waits on is
# pending. A reader whose tokens come back to back (a step that costs nothing,
# as the timing model's) finds its future already set each time it is cancelled,
# and would read on until the turn ends: so it looks for a cancellation itself,
# once every this many tokens (a look costs a few microseconds).
CANCEL_CHECK_TOKENS = 64


class TurnHandle:
    """One turn, seen from its agent. Iterate it for text pieces; afterwards
    `tokens`, `text` and the timings say what happened."""

    def __init__(
        self,
        agent: Agent,
        prompt: list[int] | Chat,
        max_tokens: int,
        sampling: Sampling,
        ignore_eos: bool,
        constraint: Constraint | None = None,
    ) -> None:
        self.agent = agent
        self._chat = prompt if isinstance(prompt, Chat) else None  # tokenized on entry
        self.prompt: list[int] = prompt if isinstance(prompt, list) else []
        # Started inside a handler or a critical section: the turn serves that
        # request, and runs at whatever priority its waiters lend it.
        lifts = [lift_key(agent.name, via) for via in serving.get()]
        self._request = TurnRequest(
            agent=agent.name,
            priority=agent.priority,
            prompt=self.prompt,
            max_tokens=max_tokens,
            sampling=sampling,
            ignore_eos=ignore_eos,
            lifts=lifts,
            constraint=constraint,
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
        self.cached_tokens = 0  # prompt positions the prefix cache supplied at admission
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
        try:
            await check_constraint(self._gpu.constraints, self._request.constraint)
        except UsageError as exc:
            raise UsageError(f"agent {self.agent.name!r}: {exc}") from None
        if self._chat is not None:
            self.prompt = await self._chat.encode()
            self._request = msgspec.structs.replace(self._request, prompt=self.prompt)
        self._channel = await self._gpu.submit(self.id, self._request)
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        if self.ended is not None:
            self._channel.receive.close()  # (the owner has closed the send end)
            if isinstance(self.ended, Finished):
                await self.agent.on_turn_end(self)
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
        if not len(self.tokens) % CANCEL_CHECK_TOKENS:
            await anyio.lowlevel.checkpoint_if_cancelled()
        receive = self._channel.receive
        while self.ended is None:
            try:  # what is already there needs no trip through the event loop
                while (update := receive.take()) is EMPTY:
                    await receive.wait()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                update = _STOPPED
            if update is _STOPPED:
                if self.ended is None:  # the owner went away without a word
                    self.ended = Failed(
                        t=0.0,
                        step=0,
                        turn=self.id,
                        agent=self.agent.name,
                        priority=self.agent.priority,
                        tokens=len(self.tokens),
                        reason="the GPU owner stopped",
                    )
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
                self.cached_tokens = update.cached_tokens
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
