"""The coding team end to end with a stand-in model (tests/scripted_engine.py)
whose answers are known: a right fix is found, verified, reviewed, tested anew,
reported and applied; garbage answers are never verified and the user's tree
stays as it was."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import anyio
import pytest

from runtime.errors import ConfigError
from swarm.coding.team import CodingTeam
from swarm.runner import SessionRunner
from swarm.session import Session
from tests.scripted_engine import ScriptedEngine

pytestmark = pytest.mark.usefixtures("plain_pytest")

CALC = 'def add(a, b):\n    """The sum."""\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n'
TESTS = "from calc import add, mul\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n"
# The answers as the constrained team writes them: the fixer's and the test
# author's one Python block, the reviewer's verdict as JSON, the planner's tool
# call in its model's format (Hermes) and then its answer.
FIX = '```python\ndef add(a, b):\n    """The sum."""\n    return a + b\n```'
NEW_TEST = "```python\nfrom calc import add\n\n\ndef test_add_negatives():\n    assert add(-1, -2) == -3\n```"
VERDICT = '{"verdict":"APPROVE","reason":"It fixes the operator for every input."}'
READ_CALC = '<tool_call>\n{"name": "read_file", "arguments": {"path": "calc.py"}}\n</tool_call>'


def good_model(prompt: str) -> str:
    if "APPROVE or REJECT" in prompt:
        return VERDICT
    if "Write one new pytest test" in prompt:
        return NEW_TEST
    if "Reply with the corrected function" in prompt:
        return FIX
    if "<tool>\n" in prompt:  # the file it asked for is in the conversation
        return "It adds two numbers." if "return a - b" in prompt else "I could not read it."
    return READ_CALC


def garbage_model(prompt: str) -> str:
    """Free text where a code block is asked for: the constraint bends it into a
    block, which holds no function of the project."""
    if "Reply with the corrected function" in prompt:
        return "```diff\n--- a/calc.py\n+++ b/calc.py\n@@ -9,9 +9,9 @@\n-nothing\n+here\n```\n"
    return "No idea."


def make_repo(root: Path) -> Path:
    root.mkdir()
    (root / "calc.py").write_text(CALC)
    (root / "test_calc.py").write_text(TESTS)
    for args in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start"]):
        subprocess.run(["git", *args], cwd=root, check=True)
    return root


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def run_team(
    tmp_path: Path, model, *, apply: bool, rounds: int | None = None, dirty: bool = False
) -> tuple[CodingTeam, ScriptedEngine, Path]:
    project = make_repo(tmp_path / "proj")
    if dirty:
        (project / "notes.txt").write_text("mine, not committed\n")
    out = tmp_path / "out"
    out.mkdir()
    engine = ScriptedEngine(model)
    team = CodingTeam(project, out, fixers=2, candidates=3, rounds=rounds, script=["What does add do?"])
    session = Session(slots=4, prefix_cache=False, workspace=str(project), duration=300)
    runner = SessionRunner(session, engine=engine, out=out)
    runner.agents = team.agents
    anyio.run(runner.run)
    return team, engine, team.finish(apply=apply, model="scripted") if not dirty else out / "report.md"


def test_a_right_answer_is_verified_reviewed_tested_reported_and_applied(tmp_path: Path) -> None:
    team, engine, report_path = run_team(tmp_path, good_model, apply=True)
    planner = team.planner
    assert planner.baseline.failing == ["test_calc.py::test_add"]
    (result,) = planner.results.values()
    assert result.verified and result.fixed == ["test_calc.py::test_add"] and result.candidates == 3 and result.rounds == 1
    assert planner.reviews["test_calc.py::test_add"].approved
    assert planner.new_tests["test_calc.py::test_add"].ran
    assert team.final is not None and team.final.verified
    assert team.final.report.outcomes["test_swarm_test_add.py::test_add_negatives"] == "passed"  # the new test runs with the fix
    report = report_path.read_text()
    assert "Fixed and verified by fixer-" in report and "+    return a + b" in report and "3 candidate(s) in 1 round(s)" in report
    assert "Review (approved)" in report and "New test (runs and passes with the fix)" in report
    assert "**What does add do?**: It adds two numbers." in report
    patches = sorted(p.name for p in (tmp_path / "out" / "patches").iterdir())
    assert patches == ["01-test_add.patch", "combined.patch", "tests-01.patch"]
    # --apply on a clean tree: the fix and the new test, and nothing else.
    project = tmp_path / "proj"
    assert "return a + b" in (project / "calc.py").read_text()
    assert (project / "test_calc.py").read_text() == TESTS
    assert "test_add_negatives" in (project / "test_swarm_test_add.py").read_text()
    # Both fixers took the one failure, and all their candidates shared one prompt:
    # the project's code, then the failure.
    fixer_prompts = [p for p in engine.asked if "Reply with the corrected function" in p]
    assert len(fixer_prompts) == 2 * 3 and len(set(fixer_prompts)) == 1
    # The planner was offered the tools, called read_file, and answered with its result.
    asked_planner = [p for p in engine.asked if "What does add do?" in p]
    assert len(asked_planner) == 2 and "<tool>read_file:" in asked_planner[0]
    assert "<call>read_file" in asked_planner[1] and "<tool>\ndef add(a, b):" in asked_planner[1]
    assert engine.bent == 0  # every written answer was already in its constraint's shape


def test_garbage_is_never_verified_and_the_tree_is_untouched(tmp_path: Path) -> None:
    project_before = None
    team, engine, report_path = run_team(tmp_path, garbage_model, apply=False, rounds=2)
    project_before = snapshot(tmp_path / "proj")
    (result,) = team.planner.results.values()
    assert not result.verified and result.candidates == 6 and result.rounds == 2
    assert result.note == "no answer held a patch" and engine.bent > 0
    report = report_path.read_text()
    assert "Not fixed by fixer-" in report and "no fix to test" in report
    assert not any((tmp_path / "out" / "patches").iterdir())
    assert (tmp_path / "proj" / "calc.py").read_text() == CALC and snapshot(tmp_path / "proj") == project_before
    # The second round was told why the first failed.
    fixer_prompts = [p for p in engine.asked if "Reply with the corrected function" in p]
    assert "An earlier answer" not in fixer_prompts[0] and "An earlier answer held no code block" in fixer_prompts[-1]


def test_the_files_a_traceback_names_come_first_only_when_not_all_fit(tmp_path: Path) -> None:
    from agents.coding import CodingAgent
    from swarm.coding.project import ProjectCopy
    from swarm.coding.sandbox import Sandbox
    from swarm.coding.testing import detect_runner
    from swarm.coding.tools import Toolbox

    project = make_repo(tmp_path / "proj")
    (project / "big.py").write_text("X = 1\n" * 1000)
    copy = ProjectCopy.create(project, tmp_path / "out", worktree=False)
    agent = CodingAgent("a", 0, tools=Toolbox(copy, detect_runner(copy.copy), Sandbox(), tmp_path / "scratch"))
    roomy = anyio.run(lambda: agent.project_context(100_000, mentioned_in="calc.py:3: in add"))
    tight = anyio.run(lambda: agent.project_context(500, mentioned_in="calc.py:3: in add"))
    assert roomy.index("File big.py") < roomy.index("File calc.py")  # all fits: the same order for every prompt
    assert tight.startswith("File calc.py") and "def add" in tight


def test_apply_on_a_dirty_tree_refuses_saying_what_it_would_do(tmp_path: Path) -> None:
    team, _, report_path = run_team(tmp_path, good_model, apply=True, dirty=True)
    before = {
        k: v for k, v in snapshot(tmp_path / "proj").items() if not k.startswith(".git/worktrees/")
    }  # (finish takes the worktree out)
    with pytest.raises(ConfigError) as caught:
        team.finish(apply=True, model="scripted")
    message = str(caught.value)
    assert "notes.txt" in message and "nothing written" in message and "calc.py" in message.split("it would")[1]
    assert snapshot(tmp_path / "proj") == before and (tmp_path / "proj" / "calc.py").read_text() == CALC
    assert "+    return a + b" in report_path.read_text()  # the report and patches are written all the same
    assert (tmp_path / "out" / "patches" / "combined.patch").is_file()


def test_a_fix_for_one_failure_of_two_is_reported_combined_and_applied(tmp_path: Path) -> None:
    """The other failure (mul) gets no fix: the combined patch is judged on what
    the fixes fixed, so it is still verified, and applied."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "calc.py").write_text(CALC.replace("a * b", "a ** b"))
    (project / "test_calc.py").write_text(TESTS)
    out = tmp_path / "out"
    out.mkdir()
    team = CodingTeam(project, out, fixers=1, candidates=2, rounds=1, reviewer=False, tester=False, worktree=False)
    runner = SessionRunner(
        Session(slots=4, prefix_cache=False, workspace=str(project), duration=300), engine=ScriptedEngine(good_model), out=out
    )
    runner.agents = team.agents
    anyio.run(runner.run)
    report = team.finish(apply=True, model="scripted").read_text()
    results = team.planner.results
    assert results["test_calc.py::test_add"].verified and not results["test_calc.py::test_mul"].verified
    assert team.final is not None and team.final.verified and team.final.fixed == ["test_calc.py::test_add"]
    assert "after (every verified fix together): 1 failed, 1 passed" in report
    assert "return a + b" in (project / "calc.py").read_text() and "a ** b" in (project / "calc.py").read_text()


def test_a_rejecting_verdict_reaches_the_planner_typed(tmp_path: Path) -> None:
    """The reviewer's answer is a PatchVerdict decoded from its schema: a REJECT
    is a note that does not approve, with the reason it gave."""

    def rejecting_model(prompt: str) -> str:
        if "APPROVE or REJECT" in prompt:
            return '{"verdict":"REJECT","reason":"It special-cases the test."}'
        return good_model(prompt)

    project = make_repo(tmp_path / "proj")
    out = tmp_path / "out"
    out.mkdir()
    engine = ScriptedEngine(rejecting_model)
    team = CodingTeam(project, out, fixers=1, candidates=1, rounds=1, tester=False, worktree=False)
    runner = SessionRunner(Session(slots=4, prefix_cache=False, workspace=str(project), duration=300), engine=engine, out=out)
    runner.agents = team.agents
    anyio.run(runner.run)
    note = team.planner.reviews["test_calc.py::test_add"]
    assert not note.approved and note.text == "REJECT: It special-cases the test."
    assert engine.bent == 0
