"""Background agents that work through a workspace folder, file by file.

Each proposal goes to `<out>/<agent>/<file>.md`. The user's files are only ever
read: writes go through `_write`, which refuses any path outside the out folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import anyio

from agents.base import MAX_TOKENS, RecordingAgent, clip
from runtime.agent import check_max_tokens
from runtime.files import write_private
from swarm import BACKGROUND, TurnCancelled, TurnFailed

SOURCE_SUFFIXES = (".py", ".md", ".txt", ".toml")


class WorkspaceAgent(RecordingAgent):
    """Loops over the workspace's files, asking the model about each with
    `system_prompt` and `task`, and writes each answer as a proposal. With
    `parallel` > 1 it keeps that many turns in flight, so a few agents can keep
    every slot busy. `rounds` bounds the passes over the files (None: forever)."""

    system_prompt: ClassVar[str] = "You are a helpful coding assistant."
    task: ClassVar[str] = "Comment on this file."

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

    def request(self, path: Path, text: str) -> str:
        """The user message for one file; override to change what is asked."""
        return f"{self.task}\n\nFile {path.name}:\n```\n{clip(text, self.max_file_chars)}\n```"

    async def propose(self, path: Path) -> Path:
        """Ask the model about one file and write its proposal."""
        text = path.read_text(errors="replace")
        reply = await self.answer(self.system_prompt, self.request(path, text), max_tokens=self.max_tokens)
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


class Refactorer(WorkspaceAgent):
    system_prompt = "You are a careful Python engineer. You suggest small refactorings."
    task = "Suggest one refactoring for this file and show the changed code."


class TestWriter(WorkspaceAgent):
    __test__ = False  # not a pytest test class, whatever its name
    system_prompt = "You write short pytest tests for Python code."
    task = "Write two pytest tests for this file."

    def files(self) -> list[Path]:
        return [f for f in super().files() if f.suffix == ".py"]


class DocWriter(WorkspaceAgent):
    system_prompt = "You write clear, short docstrings and READMEs."
    task = "Write a short docstring for each function in this file."
