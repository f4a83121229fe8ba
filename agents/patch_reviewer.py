"""The patch reviewer: reads each verified patch and says whether it fixes the
bug or only games the test. The tests already verified it; this is a second
opinion for the report.

Its answer is data, a `PatchVerdict` (APPROVE or REJECT, and why), its decoding
held to that schema: the planner gets a verdict whatever the model writes."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from agents.coding import TEAM_SYSTEM, CodingAgent, ReviewNote, VerifiedPatch
from swarm import BACKGROUND, TurnFailed, handler


class PatchVerdict(msgspec.Struct):
    verdict: Literal["APPROVE", "REJECT"]
    reason: Annotated[str, msgspec.Meta(max_length=200)]


class PatchReviewer(CodingAgent):
    def __init__(
        self, name: str = "reviewer", priority: int = BACKGROUND, *, planner: str = "planner", max_tokens: int = 96, **kwargs: Any
    ) -> None:
        super().__init__(name, priority, **kwargs)
        self.planner = planner
        self.max_tokens = max_tokens

    @handler
    async def review(self, msg: VerifiedPatch) -> None:
        context = await self.project_context()
        try:
            verdict, text = await self.answer_as(
                PatchVerdict,
                TEAM_SYSTEM,
                (
                    f"{context}\nThis patch makes the failing test {msg.test} pass:\n```diff\n{msg.diff}\n```\n"
                    "Does it fix the bug in general, or only special-case the test? "
                    "Answer with your verdict, APPROVE or REJECT, and one sentence of reason."
                ),
                max_tokens=self.max_tokens,
            )
        except TurnFailed as exc:  # the planner waits for a note on every verified patch
            await self.tell(self.planner, ReviewNote(msg.test, True, f"(no review: {exc.reason})"))
            return
        if verdict is None:  # an engine that cannot constrain, or the JSON cut off: the text's first word
            word = text.strip().split(None, 1)[0].strip('*:.,{"').upper() if text.strip() else ""
            await self.tell(self.planner, ReviewNote(msg.test, word != "REJECT", text.strip()))
            return
        await self.tell(self.planner, ReviewNote(msg.test, verdict.verdict == "APPROVE", f"{verdict.verdict}: {verdict.reason}"))
