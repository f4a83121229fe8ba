"""The command line on bad or odd input: usage errors exit 2 with one line naming
the valid choices, runtime failures exit 1 with one line, nothing is silently
ignored, and a closed pipe is no error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from swarm.cli import main

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "argv, says",
    [
        (["sim", "--arrivals", "-5"], "arrivals must be >= 1"),
        (["sim", "--foreground-interval-s", "-1"], "foreground_interval_s must be > 0"),
        (["sim", "--background.mean", "nan"], "mean must be > 0"),
        (["sim", "--policies", ","], "choose from fcfs, priority, recompute, swap, resident"),
        (["sim", "--policies", "residnet"], "choose from fcfs, priority, recompute, swap, resident"),
        (["generate", "hi", "--top-p", "0.5"], "add --temperature"),
        (["generate", "hi", "--seed", "3"], "add --temperature"),
        (["tail", "{events}", "--event", "turn.preemted"], "turn.preempted"),
    ],
)
def test_a_usage_error_exits_2_with_one_line_naming_the_choices(argv, says, events_file, capsys) -> None:
    argv = [a.replace("{events}", str(events_file)) for a in argv]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and says in err and "Traceback" not in err
    assert out == ""


def test_a_runtime_failure_exits_1_with_one_line(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    assert main(["generate", "hi", "--model", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("swarm generate: error:")


def test_version_and_a_help_that_reads_as_sentences(capsys) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("swarm 0.")
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "lives in its own module" not in text and "--version" in text


def test_tail_in_pretty_mode_into_a_pipe_closed_early_exits_0(events_file) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    tail = subprocess.Popen([sys.executable, "-m", "swarm.cli", "tail", str(events_file)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert tail.stdout.readline()
    tail.stdout.close()  # what `| head -1` does
    rc = tail.wait(timeout=60)
    with tail.stderr:
        assert rc == 0, tail.stderr.read().decode()


def test_tail_shows_a_finished_file_in_time_order(events_file, capsys) -> None:
    assert main(["tail", str(events_file), "--json"]) == 0
    from runtime.events import decode

    times = [decode(line).t for line in capsys.readouterr().out.splitlines()]
    assert times == sorted(times) and len(times) > 10


@pytest.mark.asyncio
async def test_turns_ended_by_shutdown_say_the_swarm_stopped() -> None:
    from runtime.events import Admitted, Cancelled
    from runtime.timing import TimingEngine
    from swarm import Agent, Swarm

    class Busy(Agent):
        async def run(self) -> None:
            await self.complete([1, 2], max_tokens=10**6, ignore_eos=True)

    with anyio.fail_after(30):
        async with Swarm(TimingEngine(), slots=2) as s:
            sub = s.bus.subscribe(max_buffer=10**6)
            for i in range(3):
                await s.spawn(Busy(f"busy{i}"))
            while s.bus.counts[Admitted] < 2:
                await anyio.sleep(0.01)
    cancels = [e async for e in sub if isinstance(e, Cancelled)]
    assert len(cancels) == 3 and {e.reason for e in cancels} == {"swarm stopped"}
