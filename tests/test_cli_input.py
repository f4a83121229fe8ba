"""The command line on bad or odd input: usage errors exit 2 with one line naming
the valid choices, runtime failures exit 1 with one line, nothing is silently
ignored, and a closed pipe is no error."""

from __future__ import annotations

import argparse
import json
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
    tail = subprocess.Popen(
        [sys.executable, "-m", "swarm.cli", "tail", str(events_file)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert tail.stdout.readline()
    tail.stdout.close()  # what `| head -1` does
    rc = tail.wait(timeout=60)
    with tail.stderr:
        assert rc == 0, tail.stderr.read().decode()


def test_tail_shows_a_finished_file_in_time_order(events_file, capsys) -> None:
    assert main(["tail", str(events_file), "--json"]) == 0
    from runtime.events.kinds import decode

    times = [decode(line).t for line in capsys.readouterr().out.splitlines()]
    assert times == sorted(times) and len(times) > 10


@pytest.mark.asyncio
async def test_turns_ended_by_shutdown_say_the_swarm_stopped() -> None:
    from runtime.events.kinds import Admitted, Cancelled
    from runtime.scheduling.timing import TimingEngine
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


# ------------------------------------------------------------ conventions (issue 22, item 14)


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "hi", "--model", "qwen-coder"],
        ["serve", "--model", "qwen-coder"],
        ["run", "--model", "qwen-coder", "--quiet"],
        ["bench", "engine", "--model", "qwen-coder"],
        ["models", "--fetch", "qwen-coder"],
    ],
)
def test_a_misspelt_catalogue_name_exits_2_with_the_closest_names(argv, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)  # `run` writes its out folder here
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown model 'qwen-coder' (did you mean 'qwen2.5-coder-" in err, err


def test_swarm_model_in_the_environment_is_the_default_model_and_checked_the_same(tiny_gguf, monkeypatch, capsys) -> None:
    monkeypatch.setenv("SWARM_MODEL", "smolm2-135m")
    assert main(["generate", "hi"]) == 2
    assert "$SWARM_MODEL: unknown model 'smolm2-135m' (did you mean 'smollm2-135m'?)" in capsys.readouterr().err
    monkeypatch.setenv("SWARM_MODEL", str(tiny_gguf))
    assert main(["generate", "hi", "--max-tokens", "2", "--json"]) == 0


def test_servings_host_port_and_key_come_from_the_environment_below_the_flags(monkeypatch) -> None:
    from swarm.cli import build_parser

    monkeypatch.setenv("SWARM_HOST", "0.0.0.0")
    monkeypatch.setenv("SWARM_PORT", "9123")
    monkeypatch.setenv("SWARM_API_KEY", "sekrit")
    args = build_parser().parse_args(["serve"])
    assert (args.host, args.port, args.api_key) == ("0.0.0.0", 9123, "sekrit")
    args = build_parser().parse_args(["serve", "--port", "7000", "--api-key", "k"])
    assert (args.port, args.api_key) == (7000, "k")
    assert "sekrit" not in build_parser()._subparsers._group_actions[0].choices["serve"].format_help()


def _every_parser():
    from swarm.cli import build_parser

    todo = [("swarm", build_parser())]
    while todo:
        name, parser = todo.pop()
        yield name, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo += [(f"{name} {sub}", child) for sub, child in action.choices.items()]


def test_every_flag_of_every_command_has_help_and_shows_its_default(monkeypatch) -> None:
    for var in ("SWARM_HOST", "SWARM_PORT", "SWARM_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    for name, parser in _every_parser():
        formatter = parser._get_formatter()
        for action in parser._actions:
            if not action.option_strings or isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
                continue
            text = formatter._expand_help(action) if action.help else ""
            assert text, f"{name} {action.option_strings[0]} has no help"
            if action.default not in (None, False, argparse.SUPPRESS):
                assert "default" in text, f"{name} {action.option_strings[0]}: {text!r} does not show its default"
    serve = dict(_every_parser())["swarm serve"].format_help()
    assert "(default: 8000)" in serve and "(default: resident)" in serve and "(default: 128" in serve
    for var in ("SWARM_MODEL", "SWARM_DEVICE", "SWARM_HOST", "SWARM_PORT", "SWARM_API_KEY"):
        assert var in serve


def test_generate_dash_reads_the_message_from_stdin(tiny_gguf) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "swarm.cli", "generate", "--model", str(tiny_gguf), "--max-tokens", "2", "--json"]
    piped = subprocess.run([*argv, "-"], input="a message\nof two lines", capture_output=True, text=True, env=env, check=True)
    given = subprocess.run([*argv, "a message\nof two lines"], capture_output=True, text=True, env=env, check=True)
    assert json.loads(piped.stdout)["prompt_ids"] == json.loads(given.stdout)["prompt_ids"]
