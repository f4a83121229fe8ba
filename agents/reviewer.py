"""The reviewer: reviews workspace files in the background, and answers review
requests from other agents. While a foreground agent waits on its `Review`
reply, the reviewer runs at the asker's priority (priority inheritance)."""

from __future__ import annotations

import msgspec

from agents.base import clip
from agents.workspace import WorkspaceAgent
from swarm import handler


class Review(msgspec.Struct):
    """Please review this code (sent with `ask`; the reply is a Verdict)."""

    path: str
    code: str


class Verdict(msgspec.Struct):
    path: str
    text: str


class Reviewer(WorkspaceAgent):
    system_prompt = "You are a strict code reviewer. You point out bugs and unclear code."
    task = "Review this file: list its problems, most important first."

    @handler
    async def review(self, msg: Review) -> Verdict:
        text = await self.answer(self.system_prompt, f"{self.task}\n\n```\n{clip(msg.code, self.max_file_chars)}\n```", max_tokens=self.max_tokens)
        return Verdict(msg.path, text)
