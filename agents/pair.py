"""The pair programmer: the foreground agent a person talks to.

Messages come from the terminal, or from a script (a list, or a file with one
message a line) for unattended runs. "review FILE" is handed to the reviewer
with `ask`: while it waits, the reviewer inherits the foreground priority, so
the person's request never waits behind background work.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

from agents.base import MAX_TOKENS, RecordingAgent, clip
from agents.reviewer import Review, Verdict
from runtime.agent import check_max_tokens
from runtime.events.files import open_private
from swarm import FOREGROUND, ActorCrashed, AskTimeout, TurnCancelled, TurnFailed

SYSTEM = "You are a friendly pair programmer. Answer briefly."


class PairProgrammer(RecordingAgent):
    def __init__(
        self,
        name: str = "pair",
        priority: int = FOREGROUND,
        *,
        workspace: str | Path = ".",
        out: str | Path | None = None,
        script: Sequence[str] | str | Path | None = None,
        interval_s: float = 10.0,
        turns: int | None = None,
        reviewer: str = "reviewer",
        max_tokens: int = MAX_TOKENS,
        say: Callable[[str], None] | None = None,
        log_text: bool = False,
        **kwargs: Any,
    ) -> None:
        check_max_tokens(name, max_tokens)
        super().__init__(name, priority, log_text=log_text, **kwargs)
        self.workspace = Path(workspace).resolve()
        self.out = Path(out).resolve() / name if out is not None else None
        self.script = _read_script(script)
        self.interval_s = interval_s  # pause before each scripted message
        self.turns = turns  # stop after this many messages (None: when input ends)
        self.reviewer = reviewer
        self.max_tokens = max_tokens
        self.say = say or (lambda text: print(text, flush=True))
        self.answered = 0
        self.review_asks = 0

    async def run(self) -> None:
        async for message in self.messages():
            self.say(f"you> {message}")
            try:
                reply = await self.handle(message)
            except (anyio.get_cancelled_exc_class(), TurnCancelled):
                # The swarm is stopping (its duration, Ctrl-C): a question on screen gets a word.
                self.say(f"{self.name}> (no answer: the swarm stopped before it came)")
                raise
            self.say(f"{self.name}> {reply.strip()}")
            self.answered += 1
            if self.log_text and self.out is not None:
                with open_private(self.out / "transcript.md", "a") as f:
                    f.write(f"**you**: {message}\n\n**{self.name}**: {reply.strip()}\n\n")
            if self.turns is not None and self.answered >= self.turns:
                return

    async def handle(self, message: str) -> str:
        word, _, rest = message.partition(" ")
        if word.lower() == "review" and rest:
            return await self.ask_review(rest.strip())
        return await self.answer(SYSTEM, message, max_tokens=self.max_tokens)

    async def ask_review(self, name: str) -> str:
        path = self.workspace / name
        if not path.is_file():
            return f"(no file {name!r} in the workspace)"
        self.review_asks += 1
        try:
            verdict: Verdict = await self.ask(self.reviewer, Review(name, clip(path.read_text(errors="replace"))), timeout=600)
        except (ActorCrashed, AskTimeout, TurnFailed) as exc:
            return f"(the reviewer could not answer: {exc})"
        return verdict.text

    async def messages(self):
        """The scripted messages, each after `interval_s`; else lines typed on the terminal."""
        if self.script is not None:
            for message in self.script:
                await anyio.sleep(self.interval_s)
                yield message
            return
        while True:
            line = await anyio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
            if not line:
                return  # end of input
            if line.strip():
                yield line.strip()


def _read_script(script: Sequence[str] | str | Path | None) -> list[str] | None:
    if script is None:
        return None
    if isinstance(script, (str, Path)):
        return [line.strip() for line in Path(script).read_text().splitlines() if line.strip()]
    return [str(m) for m in script]
