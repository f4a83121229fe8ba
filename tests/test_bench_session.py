"""`swarm bench session`'s plumbing, with the stand-in model
(tests/scripted_engine.py): both runs ask every question through the planner's
tools, the busy run's turns all happen while a fixer works, and the figures
come from the planner's turn-end events."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from swarm.bench.session import QUESTIONS, format_report, measure
from tests.scripted_engine import ScriptedEngine

pytestmark = pytest.mark.usefixtures("plain_pytest")

CALC = "def add(a, b):\n    return a - b\n"
TESTS = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
ANSWER = "It subtracts: the bug."


def model(prompt: str) -> str:
    if "Reply with the corrected function" in prompt:
        return "```python\ndef add(a, b):\n    return a * b\n```"  # never right: the fixer works to the end
    if "<tool>\n" in prompt:
        return ANSWER
    return '<tool_call>\n{"name": "read_file", "arguments": {"path": "calc.py"}}\n</tool_call>'


def test_both_runs_ask_every_question_and_the_busy_one_under_a_working_fixer(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    project = tasks / "calc"
    project.mkdir(parents=True)
    (project / "calc.py").write_text(CALC)
    (project / "test_calc.py").write_text(TESTS)
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    engine = ScriptedEngine(model)
    questions = QUESTIONS[:3]
    report = measure(
        engine, "calc", questions, fixers=1, candidates=2, slots=4, interval_s=0, answer_tokens=128, prefix_cache=False, tasks=tasks
    )
    solo, busy = report["solo"], report["busy"]
    # Each question: a turn that calls read_file, then the answer's turn.
    assert solo["turns"] == busy["turns"] == 2 * len(questions)
    assert solo["busy_turns"] == 0 and busy["busy_turns"] == busy["turns"]
    for run in (solo, busy):
        assert run["ttft_s"]["p50"] > 0 and run["itl_s"]["p50"] > 0
    assert sum("Reply with the corrected function" in p for p in engine.asked) >= 2  # the fixer ran its rounds
    for key in ("ttft_p99", "itl_p50"):
        ratio = report["ratios"][key]
        assert ratio["ratio"] > 0 and ratio["met"] == (ratio["ratio"] <= ratio["bound"])
    text = format_report({**report, "model": "scripted"})
    assert "TTFT p99 busy/solo" in text and "ITL p50 busy/solo" in text
