"""The test author: writes a new test for each verified fix. The new test must
run: collected, and passing with the fix applied, with nothing else broken.
Its answer is held to one fenced Python block (swarm.coding.patches.PYTHON_BLOCK):
the test file's code, nothing else."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any

from agents.coding import TEAM_SYSTEM, CodingAgent, NewTests, VerifiedPatch
from swarm import BACKGROUND, TurnFailed, handler
from swarm.coding.patches import FENCE, PYTHON_BLOCK, code_block

NAME = re.compile(r"[^a-z0-9]+")


class TestAuthor(CodingAgent):
    __test__ = False  # not a pytest test class, whatever its name

    def __init__(
        self, name: str = "tester", priority: int = BACKGROUND, *, planner: str = "planner", max_tokens: int = 200, **kwargs: Any
    ) -> None:
        super().__init__(name, priority, **kwargs)
        self.planner = planner
        self.max_tokens = max_tokens

    @handler
    async def write_tests(self, msg: VerifiedPatch) -> None:
        try:
            note = await self.author(msg)
        except TurnFailed as exc:  # the planner waits for a note on every verified patch
            note = NewTests(test=msg.test, ran=False, note=f"no test written: {exc.reason}")
        await self.tell(self.planner, note)

    async def author(self, msg: VerifiedPatch) -> NewTests:
        test_file, _, _ = msg.test.partition("::")
        context = await self.project_context()
        answer = await self.answer(
            TEAM_SYSTEM,
            (
                f"{context}\nThis patch fixed a bug (the test {msg.test} failed before it):\n```diff\n{msg.diff}\n```\n"
                "Write one new pytest test function for the fixed behaviour, a case the old test does not check. "
                "Reply with the test and its imports in one ```python block."
            ),
            max_tokens=self.max_tokens,
            regex=PYTHON_BLOCK,
        )
        code = code_block(answer)
        if code is None:  # free text where the engine cannot constrain, or a block cut off at max_tokens
            code = next((body for lang, body in FENCE.findall(answer) if lang.lower() in ("", "py", "python")), "")
        if "def test" not in code:
            return NewTests(test=msg.test, ran=False, note="the answer held no test function")
        slug = NAME.sub("_", msg.test.split("::")[-1].lower()).strip("_")[:40]
        path = str(PurePosixPath(test_file).with_name(f"test_swarm_{slug}.py"))
        diff = msg.diff + new_file_diff(path, code)
        judged = await self.use("propose_patch", self.tools.propose_patch(diff, targets=[]))
        new = {t: o for t, o in (judged.report.outcomes if judged.report else {}).items() if t.startswith(path + "::")}
        ran = judged.applies and not judged.broken and bool(new) and all(o == "passed" for o in new.values())
        note = "" if ran else (judged.error or judged.feedback() if not new else f"new tests: {new}")[:500]
        return NewTests(test=msg.test, ran=ran, diff=new_file_diff(path, code) if ran else "", note=note)


def new_file_diff(path: str, text: str) -> str:
    lines = (text if text.endswith("\n") else text + "\n").splitlines()
    return f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1,{len(lines)} @@\n" + "".join(f"+{line}\n" for line in lines)
