"""The reviewer: reviews workspace files in the background, and answers review
requests from other agents. While a foreground agent waits on its `Review`
reply, the reviewer runs at the asker's priority (priority inheritance).

Its answer is data: a list of `Finding`s (file, line, severity, message), its
decoding held to their schema, so the asker gets them typed whatever the model.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from agents.workspace import WorkspaceAgent
from swarm import handler


class Review(msgspec.Struct):
    """Please review this code (sent with `ask`; the reply is a Verdict)."""

    path: str
    code: str


class Finding(msgspec.Struct):
    """One problem in a file."""

    file: Annotated[str, msgspec.Meta(max_length=200)]
    line: Annotated[int, msgspec.Meta(ge=1)]
    severity: Literal["info", "warning", "error"]
    message: Annotated[str, msgspec.Meta(max_length=300)]


class Findings(msgspec.Struct):
    findings: Annotated[list[Finding], msgspec.Meta(max_length=5)]


class Verdict(msgspec.Struct):
    path: str
    text: str  # the findings as Markdown (the model's text where it gave none)
    findings: list[Finding] = []


class Reviewer(WorkspaceAgent):
    role = "You are a strict code reviewer. You point out bugs and unclear code."
    task = "Review this file: list its problems, most important first."
    answer_type = Findings

    @handler
    async def review(self, msg: Review) -> Verdict:
        # Asked exactly as its own pass over the workspace asks: a file any agent
        # has read is already computed.
        data, text = await self.ask_for(msg.path, msg.code)
        if data is None:
            return Verdict(msg.path, text)
        return Verdict(msg.path, self.render(data), list(data.findings))

    def render(self, data: Findings) -> str:
        if not data.findings:
            return "No problems found."
        return "\n".join(f"- {f.file}:{f.line} [{f.severity}] {f.message}" for f in data.findings)
