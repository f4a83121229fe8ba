"""The task set of `swarm bench fix`: found where the bench looks, at least twelve
tasks, and each one a real bug, its tests failing before any fix."""

from __future__ import annotations

import tempfile
from pathlib import Path

import anyio
import pytest

from swarm.bench.fix import TASKS, task_names
from swarm.coding.project import ProjectCopy
from swarm.coding.sandbox import Sandbox
from swarm.coding.testing import detect_runner
from swarm.coding.tools import Toolbox

pytestmark = pytest.mark.usefixtures("plain_pytest")


def test_the_bench_finds_at_least_twelve_tasks() -> None:
    assert TASKS.is_dir(), TASKS
    assert len(task_names(None)) >= 12


@pytest.mark.parametrize("name", task_names(None))
def test_each_task_fails_before_its_fix(name: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        copy = ProjectCopy.create(TASKS / name, Path(tmp), worktree=False)
        tools = Toolbox(copy, detect_runner(copy.copy), Sandbox(), Path(tmp) / "scratch")
        report = anyio.run(tools.run_tests)
    assert report.failing, f"{name}: no test fails"
