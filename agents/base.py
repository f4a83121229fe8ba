"""What every ready-made agent shares: timing records for its turns, and prompts
that work with or without a tokenizer.

These agents are plain subclasses of the public `swarm.Agent`, written the way
you would write your own: read them as examples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from swarm import GREEDY, Agent, Sampling, TurnHandle

# The default model is tiny (SmolLM2-135M): short prompts, short answers.
MAX_FILE_CHARS = 1200  # about 300 tokens of code
MAX_TOKENS = 96

T = TypeVar("T")


@dataclass(frozen=True)
class TurnRecord:
    """How one turn went, for the session summary (seconds)."""

    agent: str
    priority: int
    tokens: int
    waited_s: float | None  # request to slot
    ttft_s: float | None  # request to first token
    paused_s: float
    pauses: int
    prompt_tokens: int = 0
    turn_s: float | None = None  # request to last token
    itl_s: tuple[float, ...] = ()  # between consecutive tokens


class RecordingAgent(Agent):
    """An Agent that keeps a TurnRecord for every turn it finishes."""

    def __init__(self, name: str, priority: int, *, log_text: bool = False, **kwargs: Any) -> None:
        super().__init__(name, priority, **kwargs)
        self.records: list[TurnRecord] = []
        self.log_text = log_text  # keep prompts and answers in the agent's own files

    async def answer(
        self,
        system: str,
        user: str,
        *,
        max_tokens: int = MAX_TOKENS,
        sampling: Sampling = GREEDY,
        schema: Any = None,
        regex: str | None = None,
    ) -> str:
        """One chat turn: a system prompt and a user message in, the reply out
        (held to `schema`'s JSON, or to `regex`, if one is given; a `regex` is
        dropped where the engine cannot hold a turn to one: see `can_constrain`)."""
        prompt = self.chat(system, user)
        if not self.can_constrain:
            regex = None
        async with self.generate(prompt, max_tokens=max_tokens, sampling=sampling, schema=schema, regex=regex) as turn:
            async for _ in turn:
                pass
        return turn.text

    async def on_turn_end(self, turn: TurnHandle) -> None:
        # Every finished turn, whichever way it was run (`answer`, `use_tools`, `generate`).
        self.records.append(
            TurnRecord(
                self.name,
                self.turn_priority,  # lent while someone waits on the request it serves
                len(turn.tokens),
                turn.waited_s,
                turn.ttft_s,
                turn.paused_s,
                len(turn.pauses),
                len(turn.prompt),
                turn.turn_s,
                tuple(turn.itl_s),
            )
        )

    async def answer_as(
        self, schema: type[T], system: str, user: str, *, max_tokens: int = MAX_TOKENS, sampling: Sampling = GREEDY
    ) -> tuple[T | None, str]:
        """One chat turn whose answer is data for another agent or a file: held to
        `schema` and decoded, with the text. The data is None where the engine
        cannot hold a turn to a schema (the timing model), or the answer ran out
        of tokens before its JSON closed; the text is then all there is."""
        if not self.can_constrain:
            return None, await self.answer(system, user, max_tokens=max_tokens, sampling=sampling)
        text = await self.answer(system, user, max_tokens=max_tokens, sampling=sampling, schema=schema)
        try:
            return msgspec.json.decode(text, type=schema), text
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None, text

    @property
    def can_constrain(self) -> bool:
        return self.tokenizer is not None and self._gpu().constraints is not None

    def chat(self, system: str, user: str) -> list[dict[str, str]] | list[int]:
        if self.tokenizer is None:
            # An engine without a tokenizer (the timing model) takes token ids:
            # stand in one id per byte so prompt lengths still follow the text.
            return list((system + "\n" + user).encode()[:512])
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def clip(text: str, limit: int = MAX_FILE_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + "\n# ... (truncated)\n"
