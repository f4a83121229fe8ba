"""The reviewer: reviews workspace files in the background, and answers review
requests from other agents. While a foreground agent waits on its `Review`
reply, the reviewer runs at the asker's priority (priority inheritance)."""

from __future__ import annotations

import msgspec

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
    role = "You are a strict code reviewer. You point out bugs and unclear code."
    task = "Review this file: list its problems, most important first."

    @handler
    async def review(self, msg: Review) -> Verdict:
        # Asked exactly as its own pass over the workspace asks: a file any agent
        # has read is already computed.
        return Verdict(msg.path, await self.ask_about(msg.path, msg.code))
