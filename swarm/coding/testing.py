"""A project's tests: which command runs them, and what a run says.

A runner turns "run these tests" into a command line and its results into a
`TestReport`. `detect_runner` picks pytest where the project has tests; a
`--test-cmd` is a `CommandRunner`, which only knows pass or fail. Another runner
(unittest, npm, cargo...) is one more class with `argv` and `read`.
"""

from __future__ import annotations

import shlex
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import msgspec

from runtime.errors import ConfigError
from swarm.coding.sandbox import RunResult

PYTEST_CONFIGS = ("pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")
SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", ".venv", "venv", "node_modules", ".tox", ".mypy_cache"}
FAILED = ("failed", "error")


class TestReport(msgspec.Struct, kw_only=True):
    """One test run: each test's outcome ("passed", "failed", "error",
    "skipped"), the failing ones' messages, and how the run ended."""

    __test__ = False  # not a pytest test class, whatever its name

    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}  # test -> failure text (short)
    returncode: int | None = None
    cut_off: str | None = None
    seconds: float = 0.0
    output_tail: str = ""

    @property
    def failing(self) -> list[str]:
        return sorted(t for t, o in self.outcomes.items() if o in FAILED)

    @property
    def passing(self) -> list[str]:
        return sorted(t for t, o in self.outcomes.items() if o == "passed")

    @property
    def ran(self) -> bool:
        """Whether the tests ran at all (not cut off, something collected or an exit code of 0)."""
        return self.cut_off is None and (bool(self.outcomes) or self.returncode == 0)

    def summary(self) -> str:
        if self.cut_off:
            return f"cut off: {self.cut_off}"
        counts: dict[str, int] = {}
        for outcome in self.outcomes.values():
            counts[outcome] = counts.get(outcome, 0) + 1
        return ", ".join(f"{n} {o}" for o, n in sorted(counts.items())) or f"no tests (exit {self.returncode})"


class Runner(Protocol):
    name: str

    def argv(self, root: Path, results: Path, selected: Sequence[str] = ()) -> list[str]: ...

    def read(self, run: RunResult, results: Path) -> TestReport: ...


class PytestRunner:
    name = "pytest"

    def argv(self, root: Path, results: Path, selected: Sequence[str] = ()) -> list[str]:
        argv = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--tb=short",
            "-o",
            "junit_family=xunit1",
            f"--junitxml={results / 'junit.xml'}",
        ]
        if not any((root / name).is_file() for name in PYTEST_CONFIGS):
            # No configuration of its own: keep pytest from taking one from a folder above the copy.
            (results / "pytest.ini").write_text("[pytest]\n")
            argv += ["-c", str(results / "pytest.ini"), "--rootdir", str(root)]
        return argv + ["--", *selected] if selected else argv

    def read(self, run: RunResult, results: Path) -> TestReport:
        outcomes, messages = {}, {}
        junit = results / "junit.xml"
        if junit.is_file():
            try:
                tree = ET.parse(junit)
            except ET.ParseError:
                tree = None
            for case in tree.iter("testcase") if tree is not None else ():
                test = _node_id(case)
                outcome, message = "passed", ""
                for child in case:
                    if child.tag in ("failure", "error", "skipped"):
                        outcome = {"failure": "failed"}.get(child.tag, child.tag)
                        message = (child.text or child.get("message") or "").strip()
                        break
                outcomes[test] = outcome
                if outcome in FAILED:
                    messages[test] = message[-1500:]
        return _report(run, outcomes, messages)


class CommandRunner:
    """A test command given as a string: one outcome, from its exit code."""

    def __init__(self, command: str) -> None:
        if not command.strip():
            raise ConfigError("--test-cmd is empty")
        self.command = command
        self.name = f"command: {command}"

    def argv(self, root: Path, results: Path, selected: Sequence[str] = ()) -> list[str]:
        return ["sh", "-c", self.command]

    def read(self, run: RunResult, results: Path) -> TestReport:
        outcome = "passed" if run.ok else "failed"
        return _report(run, {self.command: outcome}, {} if run.ok else {self.command: run.output[-1500:]})


def _report(run: RunResult, outcomes: dict[str, str], messages: dict[str, str]) -> TestReport:
    return TestReport(
        outcomes=outcomes,
        messages=messages,
        returncode=run.returncode,
        cut_off=run.cut_off,
        seconds=run.seconds,
        output_tail=run.output[-3000:],
    )


def _node_id(case: ET.Element) -> str:
    file = case.get("file") or ""
    classname = case.get("classname") or ""
    name = case.get("name") or "?"
    module = file[:-3].replace("/", ".") if file.endswith(".py") else ""
    cls = classname[len(module) + 1 :] if module and classname.startswith(module + ".") else ("" if module == classname else classname)
    parts = [file or classname] + ([cls] if cls else []) + [name]
    return "::".join(parts)


def has_python_tests(root: Path) -> bool:
    for path in walk_files(root):
        name = path.name
        if name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py")):
            return True
    return False


def detect_runner(root: Path, test_cmd: str | None = None) -> Runner:
    """The runner for a project: `test_cmd` if given, else pytest where it has tests."""
    if test_cmd is not None:
        return CommandRunner(test_cmd)
    if has_python_tests(root):
        return PytestRunner()
    raise ConfigError(f"no tests found in {root} (no test_*.py or *_test.py): give the command that runs them with --test-cmd")


def walk_files(root: Path):
    """A project's files, skipping hidden folders, caches and virtual environments."""
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            entries = sorted(folder.iterdir())
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir() and not entry.is_symlink():
                if entry.name not in SKIP_DIRS and not entry.name.startswith("."):
                    stack.append(entry)
            elif entry.is_file():
                yield entry


def command_line(runner: Runner, selected: Sequence[str] = ()) -> str:
    """How a person would run the same tests (for the report)."""
    if isinstance(runner, CommandRunner):
        return runner.command
    return " ".join(["python -m pytest", *map(shlex.quote, selected)])
