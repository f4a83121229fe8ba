"""`swarm bench spec`'s plumbing on the tiny model: both tasks, off and on
alternating, every figure from the turn's end event, the same answers."""

from __future__ import annotations

from gpu.engine import OpenCLEngine
from swarm.bench.spec import TASKS, format_report, measure


def test_the_bench_runs_both_tasks_off_and_on_and_reports_from_the_end_events(tiny_gguf) -> None:
    engine = OpenCLEngine(tiny_gguf, num_blocks=64)
    said: list[str] = []
    tasks = {"edit": "Return this with one change: def f(x): return x + 1", "free": TASKS["free"]}  # (the tiny model's context is short)
    report = measure(engine, tasks, rounds=2, tokens=12, say=said.append)
    report["model"], report["cost_law"] = "tiny", engine.cost.describe()
    assert len(said) == 8 and [line.split()[2] for line in said[:4]] == ["1", "1", "2", "2"]
    for task in ("edit", "free"):
        s = report["tasks"][task]
        assert len(s["itl_off_all_s"]) == len(s["itl_on_all_s"]) == 2
        assert s["same_answers"]  # greedy: speculation changes no token
        assert s["tokens_per_step_on"] >= 1
    assert "edit" in format_report(report) and "tokens a step" in format_report(report)
