"""`swarm bench spec`'s plumbing on the tiny model: both tasks, off, lookup
and a draft model (the tiny model drafting for itself) in turn, every figure
from the turn's end event, the same answers."""

from __future__ import annotations

from gpu.engine import OpenCLEngine
from swarm.bench.spec import TASKS, format_report, measure


def test_the_bench_runs_both_tasks_off_and_on_and_reports_from_the_end_events(tiny_gguf) -> None:
    engine = OpenCLEngine(tiny_gguf, num_blocks=64)
    said: list[str] = []
    tasks = {"edit": "Return this with one change: def f(x): return x + 1", "free": TASKS["free"]}  # (the tiny model's context is short)
    draft = OpenCLEngine(tiny_gguf, num_blocks=64)
    report = measure(engine, tasks, rounds=2, tokens=12, say=said.append, variants=("lookup", "draft"), draft=draft)
    report["model"], report["cost_law"] = "tiny", engine.cost.describe()
    report["draft_model"], report["draft_cost_law"] = "tiny", draft.cost.describe()
    assert len(said) == 12 and [line.split()[1:4] for line in said[:6]] == [
        ["round", "1", "off"],
        ["round", "1", "lookup"],
        ["round", "1", "draft"],
        ["round", "2", "draft"],
        ["round", "2", "lookup"],
        ["round", "2", "off"],
    ]
    for task in ("edit", "free"):
        s = report["tasks"][task]
        assert len(s["itl_off_all_s"]) == 2 and set(s["variants"]) == {"lookup", "draft"}
        assert s["same_answers"]  # greedy: speculation changes no token
        for v in s["variants"].values():
            assert len(v["itl_on_all_s"]) == 2 and v["tokens_per_step_on"] >= 1
    text = format_report(report)
    assert "edit" in text and "draft model tiny" in text and "tokens a step" in text
