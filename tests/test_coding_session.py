"""`swarm run --project` end to end on the tiny random model: the user's tree is
byte-identical afterwards, the report and the tool events are written, --apply
refuses what it cannot do, and a person talks to the planner at a real
pseudo-terminal."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest

from gpu.model.synthetic import write_tiny_gguf
from runtime.events.kinds import ToolCalled, read_events
from swarm.cli import main

pytestmark = pytest.mark.usefixtures("plain_pytest")

ROOT = Path(__file__).resolve().parent.parent
CALC = "def add(a, b):\n    return a - b\n"
TESTS = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\ndef test_zero():\n    assert add(0, 0) == 0\n"


@pytest.fixture(scope="module")
def roomy_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random model with room for a prompt holding a small project."""
    return write_tiny_gguf(tmp_path_factory.mktemp("roomy") / "tiny.gguf", context_length=4096)


def make_repo(root: Path) -> Path:
    root.mkdir()
    (root / "calc.py").write_text(CALC)
    (root / "test_calc.py").write_text(TESTS)
    for args in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start"]):
        subprocess.run(["git", *args], cwd=root, check=True)
    return root


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def session_file(tmp_path: Path, model: Path) -> Path:
    session = tmp_path / "session.toml"
    session.write_text(f'model = "{model}"\nslots = 4\nstep_tokens = 64\nout = "{tmp_path / "out"}"\nduration = 600\n')
    return session


def only_run(tmp_path: Path) -> Path:
    (run,) = (tmp_path / "out").iterdir()
    return run


def test_a_run_leaves_the_project_as_it_was_and_reports(tmp_path: Path, roomy_gguf: Path, capsys) -> None:
    project = make_repo(tmp_path / "proj")
    before = snapshot(project)
    args = [
        "run",
        str(session_file(tmp_path, roomy_gguf)),
        "--project",
        str(project),
        "--fixers",
        "1",
        "--candidates",
        "2",
        "--rounds",
        "1",
        "--ask",
        "What does add do?",
        "--quiet",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "planner> tests before: 1 failed, 1 passed" in out
    assert "you> What does add do?" in out and out.count("planner> ") >= 3  # before, the answer, the end
    run = only_run(tmp_path)
    report = (run / "report.md").read_text()
    assert "## test_calc.py::test_add" in report and "before: 1 failed, 1 passed" in report
    assert "bubblewrap" in report or "resource limits" in report
    tools = [e for e in read_events(run / "events.jsonl") if isinstance(e, ToolCalled)]
    assert {"run_tests", "read_file", "list_files"} <= {e.tool for e in tools}
    assert all(e.duration_s >= 0 and e.agent and e.status == "ok" for e in tools)
    assert snapshot(project) == before  # files and .git: the worktree is gone again
    assert subprocess.run(["git", "worktree", "list"], cwd=project, capture_output=True, text=True).stdout.count("\n") == 1


def test_apply_without_a_verified_fix_writes_nothing_and_says_so(tmp_path: Path, roomy_gguf: Path, capsys) -> None:
    project = make_repo(tmp_path / "proj")
    (project / "calc.py").write_text(CALC + "# mine\n")  # dirty, too
    before = snapshot(project)
    args = [
        "run",
        str(session_file(tmp_path, roomy_gguf)),
        "--project",
        str(project),
        "--fixers",
        "1",
        "--candidates",
        "1",
        "--rounds",
        "1",
        "--quiet",
        "--apply",
    ]
    assert main(args) == 0
    assert "--apply: no verified fix to apply; the project is unchanged" in capsys.readouterr().out
    assert snapshot(project) == before


def test_a_project_without_tests_is_a_usage_error(tmp_path: Path, roomy_gguf: Path, capsys) -> None:
    project = tmp_path / "empty"
    project.mkdir()
    (project / "x.py").write_text("x = 1\n")
    assert main(["run", str(session_file(tmp_path, roomy_gguf)), "--project", str(project)]) == 2
    assert "--test-cmd" in capsys.readouterr().err


def test_a_person_asks_at_the_prompt(tmp_path: Path, roomy_gguf: Path) -> None:
    project = make_repo(tmp_path / "proj")
    argv = [
        "-m",
        "swarm.cli",
        "run",
        str(session_file(tmp_path, roomy_gguf)),
        "--project",
        str(project),
        "--fixers",
        "1",
        "--candidates",
        "1",
        "--rounds",
        "1",
    ]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # (plain_pytest's)
    child = pexpect.spawn(sys.executable, argv, cwd=str(ROOT), encoding="utf-8", timeout=240, env=env)
    try:
        child.expect("you> ")
        child.sendline("status")
        child.expect(r"planner> (running the tests|1 failing test\(s\))")
        child.expect("you> ")
        child.sendline("What does add do?")
        child.expect("planner> ")
        child.expect("you> ")
        child.sendline("quit")
        child.expect("report: ")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    report = (only_run(tmp_path) / "report.md").read_text()
    assert "**What does add do?**" in report
