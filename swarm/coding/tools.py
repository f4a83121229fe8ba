"""The tools agents call on a project: plain async functions on a `Toolbox`.

    list_files()              the project's files
    read_file(path)           one file's text
    search(pattern)           lines matching a regular expression
    run_tests(selected=())    the tests (all, or node ids), in the sandbox
    propose_patch(diff)       a unified diff: `git apply --check`, then the tests, on its own scratch copy

Everything that touches the disk or runs a process runs off the event loop. An
agent reports each call as a tool.called event (agents.coding.CodingAgent.use): its
name and duration, never its arguments or results, as with prompts. The
planner lets its model call the read-only ones and run_tests itself
(agents.planner: `use_tools`).
"""

from __future__ import annotations

import itertools
import re
import shutil
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import anyio

from runtime.errors import UsageError
from swarm.coding.patches import Judgement, apply_in, judge
from swarm.coding.project import ProjectCopy
from swarm.coding.sandbox import Sandbox
from swarm.coding.testing import Runner, TestReport, walk_files

MAX_READ_CHARS = 20_000


class Toolbox:
    def __init__(self, project: ProjectCopy, runner: Runner, sandbox: Sandbox, scratch: Path, *, keep_scratch: bool = False) -> None:
        self.project = project
        self.runner = runner
        self.sandbox = sandbox
        self.scratch = Path(scratch)
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.keep_scratch = keep_scratch
        self._ids = itertools.count(1)
        self._id_lock = threading.Lock()
        self.baseline: TestReport | None = None  # the first full run, what candidates are judged against

    @property
    def root(self) -> Path:
        return self.project.copy

    async def list_files(self) -> list[str]:
        return await self._off_loop("list_files", lambda: [str(p.relative_to(self.root)) for p in walk_files(self.root)])

    async def read_file(self, path: str) -> str:
        def read() -> str:
            text = self._inside(path).read_text(errors="replace")
            return text if len(text) <= MAX_READ_CHARS else text[:MAX_READ_CHARS] + "\n... (truncated)\n"

        return await self._off_loop("read_file", read)

    async def search(self, pattern: str, limit: int = 50) -> list[str]:
        """`path:line: text` for each line matching `pattern` (a regular expression)."""
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise UsageError(f"search: bad pattern {pattern!r}: {exc}") from None

        def find() -> list[str]:
            hits = []
            for path in walk_files(self.root):
                try:
                    lines = path.read_text(errors="replace").splitlines()
                except OSError:
                    continue
                for number, line in enumerate(lines, 1):
                    if regex.search(line):
                        hits.append(f"{path.relative_to(self.root)}:{number}: {line.strip()[:200]}")
                        if len(hits) >= limit:
                            return hits
            return hits

        return await self._off_loop("search", find)

    async def run_tests(self, selected: Sequence[str] = ()) -> TestReport:
        """The tests on a fresh scratch copy of the project as it stands."""
        report = await self._off_loop("run_tests", lambda: self._test(None, selected)[1])
        if self.baseline is None and not selected:
            self.baseline = report
            if not report.cut_off:
                # A candidate that loops forever is cut off long before the sandbox's own
                # limit: ten times what the whole suite took, and at least 30 s.
                limits = replace(self.sandbox.limits, timeout_s=min(self.sandbox.limits.timeout_s, max(30.0, 10 * report.seconds)))
                self.sandbox = Sandbox(limits, kind=self.sandbox.kind)
        return report

    async def propose_patch(self, diff: str, targets: Sequence[str] | None = None) -> Judgement:
        """Check and test a unified diff on its own scratch copy; judged against the
        baseline run for `targets` (default: every test failing at baseline)."""
        if self.baseline is None:
            await self.run_tests()
        assert self.baseline is not None
        goal = list(targets) if targets is not None else self.baseline.failing

        def verify() -> Judgement:
            applied, report = self._test(diff, ())
            return judge(self.baseline, report, goal, applied.diff or diff, applies=applied.ok, error=applied.error)

        return await self._off_loop("propose_patch", verify)

    def _test(self, diff: str | None, selected: Sequence[str]):
        with self._id_lock:
            n = next(self._ids)
        run_dir = self.scratch / f"run-{n}"
        tree, results = run_dir / "tree", run_dir / "results"
        results.mkdir(parents=True)
        self.project.scratch(tree)
        try:
            applied = apply_in(tree, diff) if diff is not None else None
            if applied is not None and not applied.ok:
                return applied, None
            run = self.sandbox.run(self.runner.argv(tree, results, selected), tree, writable=[results])
            return applied, self.runner.read(run, results)
        finally:
            if not self.keep_scratch:
                shutil.rmtree(run_dir, ignore_errors=True)

    def _inside(self, path: str) -> Path:
        full = (self.root / path).resolve()
        if not full.is_relative_to(self.root.resolve()) or not full.is_file():
            raise UsageError(f"no file {path!r} in the project")
        return full

    async def _off_loop(self, name: str, work: Callable):
        """`work` on a worker thread (`name` says which tool, for tracebacks)."""
        return await anyio.to_thread.run_sync(work)
