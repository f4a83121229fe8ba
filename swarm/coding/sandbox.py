"""Where a project's tests run: a sandbox that keeps them to their scratch copy.

Two kinds, the best the machine allows, chosen once (`detect_sandbox`):

- `bwrap`: bubblewrap (Debian's `bubblewrap`). The whole file system read-only,
  only the scratch copy (and a results folder) writable, a private /tmp, no
  network (its own empty network namespace), its own process namespace (every
  process of the run dies with it).
- `rlimit`: a plain subprocess, where bubblewrap is missing or the kernel will
  not give it namespaces. It cannot stop a write outside the copy or a socket:
  it only bounds what the run may take.

Both add resource limits (setrlimit: CPU seconds, address space, processes, file
size), a pids cgroup where one can be made (RLIMIT_NPROC does not bind root), a
wall-clock timeout and an output cap. A run is started in its own session and
killed whole, its process group and cgroup, when it ends, hangs or floods.
"""

from __future__ import annotations

import os
import resource
import selectors
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

KINDS = ("bwrap", "rlimit")


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 120.0
    cpu_s: int = 300
    address_space: int = 4 << 30
    processes: int = 256
    file_size: int = 256 << 20
    output_bytes: int = 1 << 20  # kept and read; past this the run is cut off
    # Test runs are background work: on a machine whose cores also run the
    # engine, a run at normal priority takes a core from the step a person is
    # waiting on (each kernel waits for its slowest thread). Niced, it gets
    # what the engine leaves.
    nice: int = 10


@dataclass
class RunResult:
    """How a sandboxed command ended: `cut_off` names why it was stopped early
    ("timeout", "output flood"), None when it ended by itself."""

    returncode: int | None
    output: str
    seconds: float
    cut_off: str | None = None
    sandbox: str = "rlimit"
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.cut_off is None and self.returncode == 0


_detected: str | None = None


def detect_sandbox() -> str:
    """ "bwrap" where bubblewrap is installed and can make its namespaces here,
    else "rlimit". Checked by running `true` in one, once a process."""
    global _detected
    if _detected is None:
        _detected = "rlimit"
        bwrap = shutil.which("bwrap")
        if bwrap is not None:
            try:
                probe = subprocess.run(
                    [bwrap, *_bwrap_namespaces(), "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "true"],
                    capture_output=True,
                    timeout=30,
                )
                if probe.returncode == 0:
                    _detected = "bwrap"
            except (OSError, subprocess.TimeoutExpired):
                pass
    return _detected


def describe_sandbox(kind: str | None = None) -> str:
    kind = kind or detect_sandbox()
    if kind == "bwrap":
        return "bubblewrap: read-only file system but the scratch copy, no network, own process namespace, resource limits, timeout"
    return (
        "a subprocess with resource limits and a timeout "
        "(bubblewrap is missing or cannot make namespaces here: writes and sockets are not stopped)"
    )


def process_cap() -> str | None:
    """What bounds a run's processes here: "cgroup", "rlimit" (not for root), or None."""
    probe = _PidsCgroup.make(8)
    if probe is not None:
        probe.remove()
        return "cgroup"
    return "rlimit" if os.geteuid() != 0 else None


def _bwrap_namespaces() -> list[str]:
    return ["--unshare-all", "--die-with-parent", "--new-session"]


class Sandbox:
    """Runs commands in `root` (a scratch copy), writable with `writable` folders."""

    def __init__(self, limits: Limits | None = None, kind: str | None = None) -> None:
        self.limits = limits or Limits()
        self.kind = kind or detect_sandbox()
        if self.kind not in KINDS:
            raise ValueError(f"sandbox kind must be one of {KINDS}, got {self.kind!r}")

    def run(self, argv: Sequence[str], root: Path, *, writable: Sequence[Path] = (), env: dict[str, str] | None = None) -> RunResult:
        """Run argv with `root` as its working folder; blocking (call it off the event loop)."""
        root = Path(root).resolve()
        env = {**_base_env(), **(env or {})}
        if self.kind == "bwrap":
            command = [
                shutil.which("bwrap") or "bwrap",
                *_bwrap_namespaces(),
                "--ro-bind",
                "/",
                "/",
                "--dev",
                "/dev",
                "--proc",
                "/proc",
                "--tmpfs",
                "/tmp",
                "--tmpfs",
                "/var/tmp",
            ]
            for folder in (root, *writable):
                command += ["--bind", str(Path(folder).resolve()), str(Path(folder).resolve())]
            command += ["--chdir", str(root), "--", *argv]
        else:
            command = list(argv)
        cgroup = _PidsCgroup.make(self.limits.processes)
        notes = [] if cgroup is not None or os.geteuid() != 0 else ["no pids cgroup: running as root, the process limit does not bind"]
        started = time.monotonic()
        process = subprocess.Popen(
            command,
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=self._limit_child(cgroup),
        )
        try:
            output, cut_off = self._collect(process, started)
        finally:
            self._kill(process, cgroup)
        return RunResult(
            returncode=process.returncode,
            output=output.decode(errors="replace"),
            seconds=time.monotonic() - started,
            cut_off=cut_off,
            sandbox=self.kind,
            notes=notes,
        )

    def _limit_child(self, cgroup: _PidsCgroup | None):
        limits = self.limits

        def limit() -> None:  # runs in the child, between fork and exec
            if cgroup is not None:
                cgroup.enter()
            resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s))
            resource.setrlimit(resource.RLIMIT_AS, (limits.address_space, limits.address_space))
            resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))
            resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_size, limits.file_size))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            os.nice(limits.nice)

        return limit

    def _collect(self, process: subprocess.Popen, started: float) -> tuple[bytes, str | None]:
        chunks: list[bytes] = []
        size = 0
        assert process.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            while True:
                left = self.limits.timeout_s - (time.monotonic() - started)
                if left <= 0:
                    return b"".join(chunks), f"timeout after {self.limits.timeout_s:g} s"
                if not selector.select(timeout=min(left, 1.0)):
                    if process.poll() is not None:
                        break  # its command ended: what it left running holds the pipe open
                    continue
                chunk = os.read(process.stdout.fileno(), 65536)
                if not chunk:
                    break
                size += len(chunk)
                chunks.append(chunk)
                if size > self.limits.output_bytes:
                    return b"".join(chunks)[: self.limits.output_bytes], f"output flood: over {self.limits.output_bytes:,} bytes"
        left = max(0.0, self.limits.timeout_s - (time.monotonic() - started))
        try:
            process.wait(timeout=left)
        except subprocess.TimeoutExpired:
            return b"".join(chunks), f"timeout after {self.limits.timeout_s:g} s"
        return b"".join(chunks), None

    @staticmethod
    def _kill(process: subprocess.Popen, cgroup: _PidsCgroup | None) -> None:
        # The whole session: a test's children go with it, whether it ended or not.
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if cgroup is not None:
            cgroup.kill_all()  # any that left the process group (setsid)
        process.wait()
        if process.stdout is not None:
            process.stdout.close()
        if cgroup is not None:
            cgroup.remove()


class _PidsCgroup:
    """A pids cgroup (v1 or v2) capping a run's processes, where this process may
    make one; the cap binds root too, which RLIMIT_NPROC does not."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def make(cls, limit: int) -> _PidsCgroup | None:
        for parent in (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup")):
            if not (parent / "cgroup.procs").exists() or not os.access(parent, os.W_OK):
                continue
            path = parent / f"slotswarm-{uuid.uuid4().hex[:12]}"
            try:
                path.mkdir()
                (path / "pids.max").write_text(str(limit))
                return cls(path)
            except OSError:
                _rmdir(path)
        return None

    def enter(self) -> None:
        with open(self.path / "cgroup.procs", "w") as f:
            f.write("0")

    def kill_all(self) -> None:
        for _ in range(50):
            try:
                pids = [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
            except OSError:
                return
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)

    def remove(self) -> None:
        for _ in range(100):
            if _rmdir(self.path):
                return
            time.sleep(0.01)  # the last processes are still being reaped


def _rmdir(path: Path) -> bool:
    try:
        path.rmdir()
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


def _base_env() -> dict[str, str]:
    # pytest's own settings reach a project's runs as they would in the person's shell.
    pytest_settings = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD")
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "VIRTUAL_ENV", "PYENV_VERSION", "PYENV_ROOT", "TERM", *pytest_settings)
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env
