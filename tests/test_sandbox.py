"""The sandbox tests run in: each breach contained and reported, with bubblewrap
where this machine can run it and with the plain subprocess fallback."""

from __future__ import annotations

import socket
import sys
import uuid
from pathlib import Path

import pytest

from swarm.coding.sandbox import Limits, Sandbox, detect_sandbox, process_cap

KINDS = [
    "rlimit",
    pytest.param("bwrap", marks=pytest.mark.skipif(detect_sandbox() != "bwrap", reason="bubblewrap missing or without namespaces here")),
]
bwrap_only = pytest.mark.skipif(detect_sandbox() != "bwrap", reason="only bubblewrap stops writes and sockets")


def run(kind: str, tmp_path: Path, code: str, **limits) -> tuple:
    root = tmp_path / "copy"
    root.mkdir(exist_ok=True)
    sandbox = Sandbox(Limits(**{"timeout_s": 20, **limits}), kind=kind)
    return sandbox.run([sys.executable, "-c", code], root), root


def alive_with(token: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if token.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


@pytest.mark.parametrize("kind", KINDS)
def test_a_command_runs_in_its_copy(kind: str, tmp_path: Path) -> None:
    result, root = run(kind, tmp_path, "import os; open('made.txt', 'w').write('x'); print(os.getcwd())")
    assert result.ok and result.cut_off is None
    assert result.output.strip() == str(root.resolve())
    assert (root / "made.txt").read_text() == "x"


@pytest.mark.parametrize("kind", KINDS)
def test_a_run_yields_the_cpu_to_the_engine(kind: str, tmp_path: Path) -> None:
    import os

    result, _ = run(kind, tmp_path, "import os; print(os.nice(0))", nice=7)
    assert result.returncode == 0 and int(result.output.split()[-1]) == os.nice(0) + 7


@pytest.mark.parametrize("kind", KINDS)
def test_a_run_that_sleeps_forever_is_cut_off(kind: str, tmp_path: Path) -> None:
    token = uuid.uuid4().hex
    result, _ = run(kind, tmp_path, f"import os, time; os.fork(); time.sleep(10_000)  # {token}", timeout_s=2)
    assert result.cut_off is not None and result.cut_off.startswith("timeout")
    assert not result.ok
    assert alive_with(token) == []  # the child it forked went with it


@pytest.mark.parametrize("kind", KINDS)
def test_a_run_ends_with_its_command_and_what_it_left_running_dies(kind: str, tmp_path: Path) -> None:
    token = uuid.uuid4().hex
    code = f"import os, time\nif os.fork() == 0:\n    time.sleep(10_000)  # {token}\nprint('done')\n"
    result, _ = run(kind, tmp_path, code)
    assert result.ok and result.cut_off is None  # not held to the timeout by the child's pipe
    assert result.output.strip() == "done"
    assert alive_with(token) == []


@pytest.mark.parametrize("kind", KINDS)
def test_a_run_that_floods_its_output_is_cut_off(kind: str, tmp_path: Path) -> None:
    result, _ = run(kind, tmp_path, "while True: print('x' * 1000)", output_bytes=200_000)
    assert result.cut_off is not None and result.cut_off.startswith("output flood")
    assert len(result.output) == 200_000


@pytest.mark.parametrize("kind", KINDS)
def test_a_run_that_forks_endlessly_is_capped_and_killed(kind: str, tmp_path: Path) -> None:
    if process_cap() is None:
        pytest.skip("no pids cgroup and running as root: nothing here bounds a run's processes")
    token = uuid.uuid4().hex
    code = f"import os, time\nwhile True:\n    if os.fork() == 0:\n        time.sleep(10_000)  # {token}\n"
    result, _ = run(kind, tmp_path, code, processes=32)
    assert not result.ok
    assert "Resource temporarily unavailable" in result.output or result.cut_off
    assert alive_with(token) == []


@pytest.mark.parametrize("kind", KINDS)
def test_a_run_that_writes_a_huge_file_is_stopped(kind: str, tmp_path: Path) -> None:
    result, root = run(kind, tmp_path, "open('big', 'wb').write(b'x' * (8 << 20))", file_size=1 << 20)
    assert not result.ok
    assert (root / "big").stat().st_size <= 1 << 20


@bwrap_only
def test_a_write_outside_the_copy_is_refused(tmp_path: Path) -> None:
    # Not beside this file: a clone under /tmp is the run's own empty /tmp inside.
    outside = Path.home() / f".sandbox-escape-{uuid.uuid4().hex}"
    try:
        result, _ = run("bwrap", tmp_path, f"open({str(outside)!r}, 'w').write('escaped')")
        assert not result.ok
        assert "Read-only file system" in result.output
        assert not outside.exists()
    finally:
        outside.unlink(missing_ok=True)


@bwrap_only
def test_a_write_to_tmp_stays_in_the_runs_own_tmp(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    result, _ = run("bwrap", tmp_path, f"open({str(outside)!r}, 'w').write('escaped')")
    assert result.ok  # /tmp is the run's own, empty and thrown away
    assert not outside.exists()


@bwrap_only
def test_a_socket_reaches_nothing(tmp_path: Path) -> None:
    # A server on this machine's loopback: reachable from here, not from the sandbox.
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        result, _ = run("bwrap", tmp_path, f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5); print('connected')")
    assert not result.ok
    assert "connected" not in result.output
    assert "Connection refused" in result.output or "unreachable" in result.output


def test_a_bad_kind_is_refused() -> None:
    with pytest.raises(ValueError):
        Sandbox(kind="docker")


def test_the_environment_is_not_passed_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLOTSWARM_SECRET_FOR_TEST", "hunter2")
    result, _ = run("rlimit", tmp_path, "import os; print(os.environ.get('SLOTSWARM_SECRET_FOR_TEST'))")
    assert result.output.strip() == "None"
