"""`swarm plot`: the slot timeline model, and pictures from events and bench results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.errors import ConfigError
from runtime.events.kinds import (
    Admitted,
    Finished,
    Inherited,
    Preempted,
    Queued,
    Restored,
    Resumed,
    SwappedOut,
    SwarmStarted,
    read_events,
)
from runtime.scheduling.priority import BACKGROUND, FOREGROUND
from runtime.scheduling.units import format_duration
from swarm.cli import main
from swarm.viewers import plot

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def bench(samples: bool) -> dict:
    policies = {
        "fifo": {"fg_wait_s": {"p50": 0.8, "p90": 2.1, "p99": 3.9, "max": 4.2}, "turns": 40},
        "preempt": {"fg_wait_s": {"p50": 0.0, "p90": 0.012, "p99": 0.02, "max": 0.031}, "turns": 40},
    }
    if samples:
        policies["fifo"]["fg_wait_samples_s"] = [0.1 * i for i in range(40)]
        policies["preempt"]["fg_wait_samples_s"] = [0.0, 0.0] + [0.001 * i for i in range(1, 38)]
    return {"policies": policies, "seed": 1}


def is_png(path: Path) -> bool:
    data = path.read_bytes()
    return len(data) > 1000 and data.startswith(PNG_MAGIC)


# ---------------------------------------------------------------- the timeline model


def test_timeline_runs_never_overlap_within_a_slot(events_file: Path) -> None:
    tl = plot.build_timeline(list(read_events(events_file)))
    assert tl.slots == 4
    for slot in range(tl.slots):
        spans = sorted((s.start, s.end) for s in tl.runs if s.slot == slot)
        assert spans, f"slot {slot} never used"
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False))


def test_timeline_matches_the_events(events_file: Path) -> None:
    events = list(read_events(events_file))
    tl = plot.build_timeline(events)
    by_name = lambda kind: [e for e in events if isinstance(e, kind)]  # noqa: E731
    # one run per admission or resume; one pause per preemption, ending when it resumed
    assert len(tl.runs) == len(by_name(Admitted)) + len(by_name(Resumed))
    assert sorted((p.turn, p.start) for p in tl.pauses) == sorted((e.turn, e.t) for e in by_name(Preempted))
    resumed_at = {(e.turn, e.t) for e in by_name(Resumed)}
    assert all((p.turn, p.end) in resumed_at for p in tl.pauses)
    # foreground waits: exactly the foreground admissions, with the owner's own waited_s
    fg = [e for e in by_name(Admitted) if e.priority >= FOREGROUND]
    assert [(w.turn, w.slot, w.waited) for w in tl.waits] == [(e.turn, e.slot, e.waited_s) for e in fg]
    assert all(s.foreground == (s.agent == "pair") for s in tl.runs)
    assert not any(s.open for s in tl.runs + tl.pauses)


def test_turns_still_running_at_the_end_are_drawn_to_the_end() -> None:
    events = [
        Queued(t=0.0, step=0, turn=1, agent="a", priority=0, tokens=3),
        Admitted(t=0.1, step=1, turn=1, agent="a", priority=0, slot=2, waited_s=0.1),
        Queued(t=0.2, step=2, turn=2, agent="b", priority=FOREGROUND, tokens=3),
        Preempted(t=0.3, step=3, turn=1, agent="a", priority=0, slot=2, tokens=2, by_turn=2, by_agent="b", by_priority=FOREGROUND),
        Admitted(t=0.3, step=3, turn=2, agent="b", priority=FOREGROUND, slot=2, waited_s=0.1),
        SwappedOut(t=0.5, step=5, turn=1, agent="a", priority=0, blocks=2),
    ]
    tl = plot.build_timeline(events)
    assert tl.slots == 3  # no swarm.started: as many as the highest slot seen
    assert [(s.turn, s.start, s.end, s.open) for s in tl.runs] == [(1, 0.1, 0.3, False), (2, 0.3, 0.5, True)]
    assert [(p.turn, p.start, p.end, p.open) for p in tl.pauses] == [(1, 0.3, 0.5, True)]
    assert tl.preemptions == [(0.3, 2)]


def test_a_clusters_merged_stream_gets_one_lane_group_per_owner(tmp_path: Path) -> None:
    events = [
        SwarmStarted(t=0.0, step=0, slots=3, policy="resident"),  # the driver's: every owner's slots
        SwarmStarted(t=0.0, step=0, slots=2, owner="gpu1"),
        SwarmStarted(t=0.0, step=0, slots=1, owner="gpu0"),
        Admitted(t=0.1, step=1, turn=1, agent="a", priority=0, slot=0, waited_s=0.0, owner="gpu0"),
        Admitted(t=0.1, step=1, turn=2, agent="b", priority=0, slot=1, waited_s=0.0, owner="gpu1"),
        Preempted(t=0.2, step=2, turn=1, agent="a", priority=0, tokens=4, reason="owner gpu0 lost", owner="gpu0"),
        Admitted(t=0.3, step=1, turn=1, agent="a", priority=0, slot=0, waited_s=0.0, owner="gpu1"),
    ]
    tl = plot.build_timeline(events)
    assert tl.lane_names == ["gpu0 slot 0", "gpu1 slot 0", "gpu1 slot 1"]
    assert sorted((s.turn, s.slot) for s in tl.runs) == [(1, 0), (1, 1), (2, 2)]  # turn 1 moved from gpu0 to gpu1
    assert is_png(plot.plot_timeline(events, tmp_path / "cluster.png"))


# ---------------------------------------------------------------- what the timeline draws

# Two slots: a background turn in slot 1 all along; in slot 0 a foreground turn
# waits 1 s for its slot (a labelled wait just above slot 1), and the reviewer
# is lent the pair's priority from 0.5 s to 3 s.
LENT = [
    SwarmStarted(t=0.0, step=0, slots=2, policy="preempt"),
    Queued(t=0.0, step=0, turn=1, agent="bg", priority=BACKGROUND, tokens=3),
    Admitted(t=0.0, step=0, turn=1, agent="bg", priority=BACKGROUND, slot=1, waited_s=0.0),
    Queued(t=0.0, step=0, turn=2, agent="other", priority=BACKGROUND, tokens=3),
    Admitted(t=0.0, step=0, turn=2, agent="other", priority=BACKGROUND, slot=0, waited_s=0.0),
    Inherited(t=0.5, step=5, agent="reviewer", priority=FOREGROUND, by_agent="pair", base_priority=BACKGROUND),
    Queued(t=1.0, step=10, turn=3, agent="reviewer", priority=FOREGROUND, tokens=3),
    Finished(t=2.0, step=20, turn=2, agent="other", priority=BACKGROUND, slot=0, tokens=20, reason="length"),
    Admitted(t=2.0, step=20, turn=3, agent="reviewer", priority=FOREGROUND, slot=0, waited_s=1.0),
    Finished(t=2.9, step=29, turn=3, agent="reviewer", priority=FOREGROUND, slot=0, tokens=9, reason="length"),
    Restored(t=3.0, step=30, agent="reviewer", priority=BACKGROUND, base_priority=BACKGROUND),
    Finished(t=4.0, step=40, turn=1, agent="bg", priority=BACKGROUND, slot=1, tokens=40, reason="length"),
]


def drawn(events):
    """The timeline's figure, laid out as it is saved, and its main axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = plot.draw_timeline(events)
    FigureCanvasAgg(fig).draw()
    return fig, fig.axes[0]


def lane(ax, row: int) -> tuple[float, float]:
    """A lane's extent on the figure, in display points (bottom, top)."""
    (_, a), (_, b) = ax.transData.transform([(0, row - 0.5), (0, row + 0.5)])
    return min(a, b), max(a, b)


def test_the_timeline_marks_lent_priority_as_the_page_does() -> None:
    fig, ax = drawn(LENT)
    rows = [t.get_text() for t in ax.get_yticklabels()]
    assert rows[-1] == "reviewer lifted"  # a lane of its own, below the slots
    (band,) = [c for c in ax.collections if c.get_gid() == "lent priority"]
    (extent,) = [path.get_extents() for path in band.get_paths()]
    assert (extent.x0, extent.x1) == pytest.approx((0.5, 3.0))
    assert len(rows) - 1 - 0.5 < extent.y0 < extent.y1 < len(rows) - 1 + 0.5
    (label,) = [t for t in ax.texts if t.get_gid() == "lent priority"]
    assert label.get_text() == f"p{FOREGROUND}: pair waits on it"
    assert "lent priority" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_a_wait_label_stays_in_its_own_lane() -> None:
    fig, ax = drawn(LENT)
    renderer = fig.canvas.get_renderer()
    (label,) = [t for t in ax.texts if t.get_text() == format_duration(1.0)]
    box = label.get_window_extent(renderer)
    bottom, top = lane(ax, 0)  # slot 0's lane, above slot 1's
    assert bottom <= box.y0 < box.y1 <= top, (box, (bottom, top))


# ---------------------------------------------------------------- pictures


def test_plot_events_writes_a_png(events_file: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "timeline.png"
    assert main(["plot", str(events_file), "-o", str(out)]) == 0
    assert is_png(out)
    assert f"wrote {out}" in capsys.readouterr().out


def test_plot_defaults_to_a_png_beside_the_input(events_file: Path) -> None:
    assert main(["plot", str(events_file)]) == 0
    assert is_png(events_file.with_suffix(".png"))


@pytest.mark.parametrize("samples", [False, True], ids=["percentiles", "samples"])
def test_plot_bench_results_writes_a_png(tmp_path: Path, samples: bool) -> None:
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench(samples), indent=2))
    assert plot.load(path)[0] == "bench"
    out = tmp_path / "bench.png"
    assert main(["plot", str(path), "-o", str(out)]) == 0
    assert is_png(out)


def test_bench_with_samples_for_some_policies_only(tmp_path: Path) -> None:
    data = bench(samples=True)
    del data["policies"]["fifo"]["fg_wait_samples_s"]
    out = plot.plot_bench(data, tmp_path / "mixed.svg")
    assert out.read_text().lstrip().startswith("<?xml")


def test_an_events_file_of_one_line_is_still_events(tmp_path: Path) -> None:
    path = tmp_path / "one.jsonl"
    path.write_text('{"event":"turn.admitted","t":0.1,"step":1,"turn":1,"agent":"a","priority":0,"slot":0}\n')
    kind, events = plot.load(path)
    assert kind == "events" and len(events) == 1
    assert is_png(plot.plot_file(path, tmp_path / "one.png"))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "is empty"),
        ("\n  \n", "is empty"),
        ("[1, 2]", "neither an events file"),
        ('{"policies": {}}', "'policies' must be an object with one entry per policy"),
        ('{"policies": {"fifo": {"fg_wait_s": {"p50": 1}}}}', "policy 'fifo' lacks fg_wait_s with p50, p90, p99, max"),
        ('{"event":"swarm.started","t":0,"step":0,"slots":4}\n', "no turn ever got a slot"),
        ('{"event":"swarm.started","t":0,"step":0}\n{"event":"turn.queued"}\n', r"bad\.jsonl:2: not a slotswarm event"),
    ],
)
def test_unusable_input_is_a_clear_error(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        plot.plot_file(path, tmp_path / "out.png")
    assert not (tmp_path / "out.png").exists()


def test_cli_reports_errors_without_a_traceback(tmp_path: Path, events_file: Path, capsys) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.touch()
    assert main(["plot", str(empty)]) == 2
    assert capsys.readouterr().err == f"swarm plot: error: {empty} is empty: nothing to plot\n"
    assert main(["plot", str(tmp_path / "missing.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["plot", str(events_file), "-o", str(tmp_path / "no" / "such" / "dir.png")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["plot", str(events_file), "-o", str(tmp_path / "t.nope")]) == 2
    assert "not supported" in capsys.readouterr().err


def test_foreground_answers_are_their_tokens_over_time() -> None:
    from runtime.events.kinds import Finished

    events = [
        Queued(t=1.0, step=0, turn=1, agent="pair", priority=FOREGROUND, tokens=3),
        Queued(t=1.0, step=0, turn=2, agent="docs", priority=0, tokens=3),
        Finished(t=3.0, step=9, turn=1, agent="pair", priority=FOREGROUND, tokens=3, reason="length", ttft_s=0.5, itl_s=0.25),
        Finished(t=3.0, step=9, turn=2, agent="docs", priority=0, tokens=3, reason="length", ttft_s=0.5, itl_s=0.25),
    ]
    assert plot.foreground_answers(events) == [(1, "pair", [1.5, 1.75, 2.0])]  # an old log: the mean gap


def test_foreground_answers_replay_each_token_time_when_the_log_has_them() -> None:
    from runtime.events.kinds import Finished

    events = [
        Queued(t=1.0, step=0, turn=1, agent="pair", priority=FOREGROUND, tokens=3),
        Finished(
            t=3.0,
            step=9,
            turn=1,
            agent="pair",
            priority=FOREGROUND,
            tokens=3,
            reason="length",
            ttft_s=0.5,
            itl_s=0.75,
            token_s=[0.5, 0.6, 2.0],
        ),
    ]
    assert plot.foreground_answers(events) == [(1, "pair", [1.5, 1.6, 3.0])]
