"""`swarm tail`: reading, filtering, following and printing event streams.

`emit_session` (also used by test_stream and test_plot) drives the real EventBus
with a small toy scheduler, so the events are schema-valid and tell a coherent
story: background turns fill 4 slots, foreground turns preempt them at token
boundaries, paused turns resume when a slot frees up.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import msgspec
import pytest
from fake_session import Clock
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.errors import ConfigError
from runtime.events.bus import EventBus
from runtime.events.kinds import (
    Admitted,
    Dropped,
    Ended,
    Event,
    Finished,
    Inherited,
    Preempted,
    Queued,
    Recomputed,
    Restored,
    Resumed,
    SwappedIn,
    SwappedOut,
    SwarmStarted,
    SwarmStopped,
    TurnEvent,
    Unrecognized,
    decode,
    encode,
    read_events,
)
from swarm.cli import main
from swarm.viewers import tail


def test_session_is_coherent(events_file: Path) -> None:
    # The generator itself: every kind the plot and tail care about occurs.
    kinds = {type(e) for e in read_events(events_file)}
    assert {Queued, Admitted, Preempted, Resumed, Finished} <= kinds
    assert {e.slot for e in read_events(events_file) if isinstance(e, TurnEvent) and e.slot is not None} == {0, 1, 2, 3}


# ---------------------------------------------------------------- reading and filtering


def test_read_file_yields_every_line_unchanged(events_file: Path) -> None:
    lines = list(tail.read_file(events_file))
    assert b"".join(raw for raw, _ in lines) == events_file.read_bytes()
    assert [item for _, item in lines] == list(read_events(events_file))


def test_json_output_round_trips_exactly(events_file: Path, capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    assert main(["tail", str(events_file), "--json"]) == 0
    assert capfdbinary.readouterr().out == events_file.read_bytes()


def test_json_keeps_fields_this_version_does_not_know(tmp_path: Path, capfdbinary) -> None:
    line = b'{"event":"turn.queued","t":1.5,"step":3,"turn":1,"agent":"a","priority":0,"tokens":4,"future":[1,2]}\n'
    path = tmp_path / "new.jsonl"
    path.write_bytes(line)
    assert main(["tail", str(path), "--json"]) == 0
    assert capfdbinary.readouterr().out == line


def test_agent_filter_keeps_events_of_and_by_the_agent(events_file: Path, capfdbinary) -> None:
    assert main(["tail", str(events_file), "--json", "--agent", "pair"]) == 0
    shown = [decode(line) for line in capfdbinary.readouterr().out.splitlines()]
    expected = [e for e in read_events(events_file) if "pair" in (getattr(e, "agent", None), getattr(e, "by_agent", None))]
    assert len(shown) == len(expected) > 0
    assert all("pair" in (getattr(e, "agent", None), getattr(e, "by_agent", None)) for e in shown)
    # preemptions of other agents' turns caused by pair are included
    assert any(isinstance(e, Preempted) and e.agent != "pair" for e in shown)


@pytest.mark.parametrize(
    ("patterns", "wanted"),
    [
        (["turn"], (Queued, Admitted, Preempted, Resumed, Ended)),
        (["turn.*"], (Queued, Admitted, Preempted, Resumed, Ended)),
        (["turn.preempted", "turn.resumed"], (Preempted, Resumed)),
        (["kv", "priority.*"], (SwappedOut, SwappedIn, Recomputed, Inherited, Restored)),
        (["*.started"], (SwarmStarted,)),
    ],
)
def test_event_filter_accepts_prefixes_and_globs(events_file: Path, patterns, wanted) -> None:
    keep = tail.make_filter(events=patterns)
    shown = [item for _, item in tail.filtered(tail.read_file(events_file), keep)]
    expected = [e for e in read_events(events_file) if isinstance(e, wanted)]
    assert shown == expected and shown


def test_filters_combine_and_always_keep_dropped_notices() -> None:
    keep = tail.make_filter(agents=["docs"], events=["turn.finished"])
    assert keep(Finished(t=0, step=0, turn=1, agent="docs", priority=0, tokens=1, reason="eos"))
    assert not keep(Finished(t=0, step=0, turn=2, agent="tests", priority=0, tokens=1, reason="eos"))
    assert not keep(Queued(t=0, step=0, turn=1, agent="docs", priority=0, tokens=1))
    assert keep(Dropped(3))


def test_pretty_output_has_a_phrase_for_each_event(events_file: Path, capsys) -> None:
    assert main(["tail", str(events_file)]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) == len(list(read_events(events_file)))
    preempted = next(e for e in read_events(events_file) if isinstance(e, Preempted))
    assert (
        f"turn {preempted.turn} ({preempted.agent}) paused at token {preempted.tokens}, slot {preempted.slot} "
        f"given to turn {preempted.by_turn} ({preempted.by_agent}, prio {preempted.by_priority})"
    ) in out
    for phrase in ("swarm up: 4 slots", "got slot", "back in slot", "finished (eos)", "runs at prio 10"):
        assert phrase in out


def test_describe_shows_unknown_events_plainly() -> None:
    text = tail.describe(Unrecognized("slot.defragmented", 0, 1, {"slot": 2, "blocks": 5}))
    assert text == "slot=2 blocks=5"


def test_a_bad_line_is_an_error_naming_its_number(events_file: Path, capsys) -> None:
    lines = events_file.read_bytes().splitlines(keepends=True)
    lines.insert(4, b'{"event": "turn.queued", "t": "soon"}\n')
    events_file.write_bytes(b"".join(lines))
    assert main(["tail", str(events_file)]) == 2
    err = capsys.readouterr().err
    assert f"{events_file}:5: not a slotswarm event" in err
    assert "Traceback" not in err


def test_not_json_is_an_error_naming_its_number(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text('{"event":"swarm.stopped","t":1,"step":2}\n\nnot json\n')
    with pytest.raises(ConfigError, match=r"x\.jsonl:3: not a JSON line"):
        list(tail.read_file(path))


def test_missing_file_and_no_running_swarm_are_clear_errors(tmp_path: Path, monkeypatch, capsys) -> None:
    assert main(["tail", str(tmp_path / "nope.jsonl")]) == 2
    assert "no such file or socket" in capsys.readouterr().err
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert main(["tail"]) == 2
    err = capsys.readouterr().err
    assert "no swarm is running" in err and "swarm tail events.jsonl" in err


# ---------------------------------------------------------------- following a growing file


def test_follow_picks_up_appended_lines_and_waits_for_partial_ones(tmp_path: Path) -> None:
    clock = Clock()
    bus = EventBus(clock=clock)
    path = bus.log_to_file(tmp_path / "live.jsonl")
    bus.emit(SwarmStarted(t=0.0, step=0, slots=4))
    later = Queued(t=0.5, step=9, turn=1, agent="a", priority=0, tokens=3)
    last = SwarmStopped(t=0.9, step=12)

    # Called at each end of file: the "swarm" writes more between reads.
    appends = [
        lambda: bus.emit(later),
        lambda: append(path, halves(last)[0]),  # half a line: not yet an event
        lambda: append(path, halves(last)[1]),
    ]

    def wait() -> bool:
        if not appends:
            return False
        appends.pop(0)()
        return True

    seen = [item for _, item in tail.read_file(path, follow=True, wait=wait)]
    bus.close()
    assert seen == [SwarmStarted(t=0.0, step=0, slots=4), later, last]


def halves(event: Event) -> tuple[bytes, bytes]:
    line = msgspec.json.encode(event) + b"\n"
    return line[: len(line) // 2], line[len(line) // 2 :]


def append(path: Path, data: bytes) -> None:
    with path.open("ab") as f:
        f.write(data)


def test_follow_in_a_terminal_stops_cleanly_on_ctrl_c(events_file: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "swarm.cli", "tail", str(events_file), "--follow", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=Path(__file__).parent.parent,
        # A shell that runs the tests in the background starts them with SIGINT
        # ignored, which the child would inherit; give it the terminal's default.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        existing = len(events_file.read_bytes().splitlines())
        got = [proc.stdout.readline() for _ in range(existing)]
        extra = b'{"event":"swarm.started","t":99.0,"step":9999,"slots":4}\n'
        append(events_file, extra)
        assert proc.stdout.readline() == extra  # appended after the start: picked up
        assert got == events_file.read_bytes().splitlines(keepends=True)[:existing]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode in (0, 130)
    assert b"Traceback" not in err


def test_source_kinds(events_file: Path, tmp_path: Path) -> None:
    assert tail.resolve_source(events_file) == ("file", events_file)
    with pytest.raises(ConfigError, match="is a directory"):
        tail.resolve_source(tmp_path)


# Events as the schema allows them: known kinds with their optional fields set
# or not, and kinds newer than this version.
_t = st.floats(0, 1e6, allow_nan=False)
_step = st.integers(0, 2**40)
_turn = dict(
    t=_t,
    step=_step,
    turn=st.integers(0, 10**6),
    agent=st.text(min_size=1, max_size=12),
    priority=st.integers(-100, 100),
    slot=st.none() | st.integers(0, 255),
)
events_strategy = st.one_of(
    st.builds(Queued, **_turn, tokens=st.integers(0, 4096)),
    st.builds(Admitted, **_turn, waited_s=st.none() | _t),
    st.builds(
        Preempted, **_turn, tokens=st.integers(0, 4096), by_agent=st.none() | st.text(max_size=12), reason=st.none() | st.text(max_size=20)
    ),
    st.builds(SwappedIn, **_turn, blocks=st.integers(0, 100)),
    st.builds(
        Unrecognized,
        st.just("x.new"),
        _t,
        _step,
        st.dictionaries(st.sampled_from(["slot", "reason"]), st.integers(0, 255) | st.text(max_size=20)),
    ),
)


@settings(max_examples=60, deadline=None)
@given(events=st.lists(events_strategy, min_size=1, max_size=12), cuts=st.lists(st.integers(0, 10_000), max_size=8))
def test_follow_reassembles_lines_however_the_writer_splits_them(events: list[Event], cuts: list[int]) -> None:
    data = b"".join(encode(e) + b"\n" for e in events)
    bounds = sorted({c % len(data) for c in cuts} | {0, len(data)})
    chunks = [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "events.jsonl"
        path.write_bytes(chunks[0])

        def wait() -> bool:  # the writer adds the next piece, wherever it was cut
            if len(chunks) == 1:
                return False
            chunks.pop(0)
            append(path, chunks[0])
            return True

        seen = [item for _, item in tail.read_file(path, follow=True, wait=wait)]
    assert seen == events


def test_a_line_says_how_much_of_a_prompt_came_from_the_prefix_cache() -> None:
    from runtime.events.kinds import Admitted, Recomputed

    about = dict(t=1.0, step=3, turn=7, agent="docs", priority=0, slot=1)
    assert "48 prompt tokens from the prefix cache" in tail.describe(Admitted(**about, waited_s=0.1, cached_tokens=48))
    assert "prefix cache" not in tail.describe(Admitted(**about, waited_s=0.1))
    assert "re-prefilling 5 tokens (64 more from the prefix cache)" in tail.describe(Recomputed(**about, tokens=5, cached_tokens=64))


def test_a_cluster_event_names_its_owner() -> None:
    from runtime.events.kinds import Admitted
    from swarm.viewers.tail import render

    line = render(Admitted(t=1.0, step=3, turn=7, agent="pair", priority=10, slot=0, waited_s=0.01, owner="gpu1")).plain
    assert "gpu1: turn 7 (pair) got slot 0" in line
    assert "gpu" not in render(Admitted(t=1.0, step=3, turn=7, agent="pair", priority=10, slot=0, waited_s=0.01)).plain


def test_a_running_turns_progress_reads_as_its_token_count_and_the_summary_counts_it() -> None:
    from runtime.events.kinds import Finished, Progress, Queued
    from swarm.summary import summarize

    about = dict(turn=7, agent="docs", priority=0)
    told = Progress(t=2.0, step=80, **about, slot=1, tokens=40)
    assert tail.describe(told) == "turn 7 (docs) at token 40"
    # A log cut off mid-turn counts what the turn had made; its end replaces that.
    live = [Queued(t=0.0, step=0, **about, tokens=3), told]
    assert summarize(live).agents["docs"].tokens == 40
    ended = [*live, Finished(t=3.0, step=120, **about, slot=1, tokens=60, reason="length")]
    assert summarize(ended).agents["docs"].tokens == 60
