"""The patch reviewer: reads each verified patch and says whether it fixes the
bug or only games the test. The tests already verified it; this is a second
opinion for the report."""

from __future__ import annotations

from typing import Any

from agents.coding import TEAM_SYSTEM, CodingAgent, ReviewNote, VerifiedPatch
from swarm import BACKGROUND, TurnFailed, handler


class PatchReviewer(CodingAgent):
    def __init__(
        self, name: str = "reviewer", priority: int = BACKGROUND, *, planner: str = "planner", max_tokens: int = 80, **kwargs: Any
    ) -> None:
        super().__init__(name, priority, **kwargs)
        self.planner = planner
        self.max_tokens = max_tokens

    @handler
    async def review(self, msg: VerifiedPatch) -> None:
        context = await self.project_context()
        try:
            answer = await self.answer(
                TEAM_SYSTEM,
                (
                    f"{context}\nThis patch makes the failing test {msg.test} pass:\n```diff\n{msg.diff}\n```\n"
                    "Does it fix the bug in general, or only special-case the test? "
                    "Start your answer with APPROVE or REJECT, then give one sentence."
                ),
                max_tokens=self.max_tokens,
            )
        except TurnFailed as exc:  # the planner waits for a note on every verified patch
            await self.tell(self.planner, ReviewNote(msg.test, True, f"(no review: {exc.reason})"))
            return
        verdict = answer.strip().split(None, 1)[0].strip("*:.,").upper() if answer.strip() else ""
        await self.tell(self.planner, ReviewNote(msg.test, verdict != "REJECT", answer.strip()))
