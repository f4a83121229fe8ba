"""What the coding team shares: its messages, and the base its agents are built on.

The planner (foreground) runs the tests and hands each failure to a fixer; a
fixer answers with a `FixResult`; verified patches go to the patch reviewer and
the test author, whose notes come back to the planner. Every message is a
msgspec Struct, and what the model writes for one is held to its shape as it
is decoded: a fixer's and the test author's code to one fenced Python block
(swarm.coding.patches.PYTHON_BLOCK), the patch reviewer's verdict to a schema.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import Any, TypeVar

import msgspec

from agents.base import RecordingAgent, clip
from swarm.coding.tools import Toolbox

T = TypeVar("T")

TEAM_SYSTEM = "You are one of a team of Python engineers fixing bugs in a small project. Be brief and exact."
SOURCE_CHARS = 6000  # of the project's own code in a prompt


class Failure(msgspec.Struct):
    test: str
    message: str


class FixRequest(msgspec.Struct):
    """Fix this failing test (told to a fixer; it tells back a FixResult)."""

    failure: Failure


class FixResult(msgspec.Struct, kw_only=True):
    test: str
    fixer: str
    verified: bool
    diff: str = ""
    fixed: list[str] = []  # every baseline failure the patch fixes (the target, maybe more)
    candidates: int = 0  # how many candidate patches were sampled
    rounds: int = 0
    tokens: int = 0  # decoded over all candidates
    seconds: float = 0.0
    note: str = ""  # why not, when not verified


class VerifiedPatch(msgspec.Struct):
    """A patch the tests verified, for review and new tests."""

    test: str
    diff: str
    message: str


class ReviewNote(msgspec.Struct):
    test: str
    approved: bool
    text: str


class NewTests(msgspec.Struct, kw_only=True):
    test: str
    ran: bool  # the new tests were collected and pass with the fix
    diff: str = ""
    note: str = ""


class CodingAgent(RecordingAgent):
    """A RecordingAgent with the project's tools; each tool call becomes a
    tool.called event (name, duration and status only)."""

    def __init__(self, name: str, priority: int, *, tools: Toolbox, **kwargs: Any) -> None:
        super().__init__(name, priority, **kwargs)
        self.tools = tools

    async def use(self, tool: str, call: Awaitable[T]) -> T:
        started = time.monotonic()
        ok = False
        try:
            result = await call
            ok = True
            return result
        finally:
            self.tell_tool_called(tool, time.monotonic() - started, "ok" if ok else "error")

    async def source_files(self) -> dict[str, str]:
        """The project's own Python files (tests apart), path -> text."""
        files = await self.use("list_files", self.tools.list_files())
        code = [f for f in files if f.endswith(".py") and not _is_test(f)]
        return {f: await self.use("read_file", self.tools.read_file(f)) for f in code}

    async def project_context(self, limit: int = SOURCE_CHARS, mentioned_in: str = "") -> str:
        """The project's code, as the shared start of every prompt about it, up to
        `limit` characters. Where it does not all fit, the files named in
        `mentioned_in` (a traceback, a question) go first; where it does, the order
        stays the same for every prompt, so they all share it (the prefix cache)."""
        files = await self.source_files()
        order = list(files)
        if sum(len(text) + 30 for text in files.values()) > limit:
            order.sort(key=lambda path: path.rsplit("/", 1)[-1] not in mentioned_in)
        parts, used = [], 0
        for path in order:
            text = files[path]
            block = f"File {path}:\n```python\n{clip(text, max(200, limit - used))}\n```\n"
            parts.append(block)
            used += len(block)
            if used >= limit:
                break
        return "".join(parts)

    async def test_source(self, test: str) -> str:
        """The failing test's own code, where it can be found."""
        path, _, name = test.partition("::")
        name = name.split("::")[-1].split("[")[0]
        try:
            text = await self.use("read_file", self.tools.read_file(path))
        except Exception:
            return ""
        lines = text.splitlines()
        for i, line in enumerate(lines):
            if line.lstrip().startswith(f"def {name}("):
                end = i + 1
                while end < len(lines) and (not lines[end].strip() or lines[end].startswith((" ", "\t"))):
                    end += 1
                return "\n".join(lines[i:end]).rstrip()
        return ""


def _is_test(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py" or path.startswith("tests/")
