"""Background agents that work through a workspace folder, file by file.

Each proposal goes to `<out>/<agent>/<file>.md`. The user's files are only ever
read: writes go through `_write`, which refuses any path outside the out folder.

The prompts put what the agents share first and what is each one's own last, as
prompt caching wants: one system prompt for the whole team, then the file, then
the agent's role and task. So every agent that reads a file reuses the K/V of
whichever computed it first (the prefix cache), and only its own few last lines
are computed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar

import anyio
import msgspec

from agents.base import MAX_TOKENS, RecordingAgent, clip
from runtime.agent import check_max_tokens
from runtime.errors import UsageError
from runtime.events.files import write_private
from swarm import BACKGROUND, TurnCancelled, TurnFailed

SOURCE_SUFFIXES = (".py", ".md", ".txt", ".toml")


TEAM_PROMPT = "You are one of a team of coding assistants working on the same project. Answer briefly."


class WorkspaceAgent(RecordingAgent):
    """Loops over the workspace's files, asking the model about each as `role`
    with `task`, and writes each answer as a proposal. With `parallel` > 1 it
    keeps that many turns in flight, so a few agents can keep every slot busy.
    `rounds` bounds the passes over the files (None: forever)."""

    role: ClassVar[str] = "You are a helpful coding assistant."
    task: ClassVar[str] = "Comment on this file."
    # The answer's shape (a msgspec Struct), for an agent whose answer is data;
    # None: free text.
    answer_type: ClassVar[type | None] = None

    def __init__(
        self,
        name: str,
        priority: int = BACKGROUND,
        *,
        workspace: str | Path,
        out: str | Path,
        max_tokens: int = MAX_TOKENS,
        max_file_chars: int = 1200,
        parallel: int = 1,
        rounds: int | None = None,
        log_text: bool = False,
        **kwargs: Any,
    ) -> None:
        check_max_tokens(name, max_tokens)
        # Checked here, not at the first round: a parallel of 0 or less would start no worker and idle for good.
        if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
            raise UsageError(f"agent {name!r}: parallel must be an int >= 1, got {parallel!r}")
        if rounds is not None and (isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0):
            raise UsageError(f"agent {name!r}: rounds must be an int >= 0 or absent, got {rounds!r}")
        super().__init__(name, priority, log_text=log_text, **kwargs)
        self.workspace = Path(workspace).resolve()
        self.out = Path(out).resolve() / name
        self.max_tokens = max_tokens
        self.max_file_chars = max_file_chars
        self.parallel = parallel
        self.rounds = rounds
        self.written: list[Path] = []
        self.failed: list[str] = []  # files the model could not take

    def files(self) -> list[Path]:
        """The workspace's text files, skipping hidden folders and our own output."""
        found = []
        for path in sorted(self.workspace.rglob("*")):
            rel = path.relative_to(self.workspace)
            if any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
                continue
            if path.is_file() and path.suffix in SOURCE_SUFFIXES and not path.resolve().is_relative_to(self.out.parent):
                found.append(path)
        return found

    def request(self, name: str, text: str) -> str:
        """The user message for one file: the file (shared by every agent that
        reads it), then this agent's role and task; override to change what is asked."""
        return f"File {name}:\n```\n{clip(text, self.max_file_chars)}\n```\n\n{self.role} {self.task}"

    async def ask_about(self, name: str, text: str) -> str:
        """The model's answer about one file, as this agent: its data written out
        as Markdown (`render`), or its text where there is no data."""
        data, reply = await self.ask_for(name, text)
        return reply if data is None else self.render(data)

    async def ask_for(self, name: str, text: str) -> tuple[Any, str]:
        """The model's answer about one file: decoded to `answer_type` where the
        engine can hold it to one (None otherwise), and as text."""
        if self.answer_type is None:
            return None, await self.answer(TEAM_PROMPT, self.request(name, text), max_tokens=self.max_tokens)
        return await self.answer_as(self.answer_type, TEAM_PROMPT, self.request(name, text), max_tokens=self.max_tokens)

    def render(self, data: Any) -> str:
        """An answer's data as the Markdown of its proposal file."""
        return msgspec.json.format(msgspec.json.encode(data)).decode()

    async def propose(self, path: Path) -> Path:
        """Ask the model about one file and write its proposal."""
        reply = await self.ask_about(path.name, path.read_text(errors="replace"))
        rel = path.relative_to(self.workspace)
        body = f"# {self.name}: {rel}\n\n{reply.strip()}\n"
        return self._write(self.out / rel.with_name(rel.name + ".md"), body)

    async def run(self) -> None:
        files = self.files()
        queue = [f for _ in range(1 if self.rounds is None else self.rounds) for f in files]
        if not queue:
            return  # nothing to do; the mailbox is still served (a reviewer's asks)
        position = 0

        async def worker() -> None:
            nonlocal position
            while self.rounds is None or position < len(queue):
                path = queue[position % len(queue)]
                position += 1
                try:
                    await self.propose(path)
                except TurnCancelled:
                    return  # the swarm is stopping
                except TurnFailed as exc:  # e.g. a file too long for the context: skip it
                    self.failed.append(f"{path.name}: {exc}")

        async with anyio.create_task_group() as tasks:
            for _ in range(self.parallel):
                tasks.start_soon(worker)

    def _write(self, path: Path, text: str) -> Path:
        path = path.resolve()
        if not path.is_relative_to(self.out):
            raise PermissionError(f"agent {self.name!r} may only write under {self.out}, not {path}")
        write_private(path, text)  # 0600, in folders made 0700
        self.written.append(path)
        return path


Line = Annotated[str, msgspec.Meta(max_length=300)]


class Refactoring(msgspec.Struct):
    summary: Line
    code: str


class TestCase(msgspec.Struct):
    __test__ = False  # not a pytest test class, whatever its name
    name: Annotated[str, msgspec.Meta(pattern=r"^test_[a-z0-9_]{1,40}$")]
    code: str


class Tests(msgspec.Struct):
    __test__ = False
    tests: Annotated[list[TestCase], msgspec.Meta(min_length=1, max_length=3)]


class Docstring(msgspec.Struct):
    function: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_.]{0,60}$")]
    docstring: Line


class Docstrings(msgspec.Struct):
    docstrings: Annotated[list[Docstring], msgspec.Meta(max_length=8)]


class Refactorer(WorkspaceAgent):
    role = "You are a careful Python engineer. You suggest small refactorings."
    task = "Suggest one refactoring for this file and show the changed code."
    answer_type = Refactoring

    def render(self, data: Refactoring) -> str:
        return f"{data.summary}\n\n```python\n{data.code}\n```"


class TestWriter(WorkspaceAgent):
    __test__ = False  # not a pytest test class, whatever its name
    role = "You write short pytest tests for Python code."
    task = "Write two pytest tests for this file."
    answer_type = Tests

    def render(self, data: Tests) -> str:
        return "\n\n".join(f"## {t.name}\n\n```python\n{t.code}\n```" for t in data.tests)

    def files(self) -> list[Path]:
        return [f for f in super().files() if f.suffix == ".py"]


class DocWriter(WorkspaceAgent):
    role = "You write clear, short docstrings and READMEs."
    task = "Write a short docstring for each function in this file."
    answer_type = Docstrings

    def render(self, data: Docstrings) -> str:
        return "\n".join(f"- `{d.function}`: {d.docstring}" for d in data.docstrings) or "(no functions to document)"
