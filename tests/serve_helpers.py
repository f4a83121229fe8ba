"""A real `swarm serve` process on an ephemeral loopback port, and raw-HTTP tools
to talk to it (http.client: what a client that is not the openai package sends).

    with ServerProcess(model, "--slots", "1") as server:
        status, headers, body = server.request("POST", "/v1/chat/completions", {...})
"""

from __future__ import annotations

import http.client
import json
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from runtime.events.kinds import Event, decode

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 300  # a cold PoCL cache compiles the kernels first
STOP_TIMEOUT_S = 60


class ServerProcess:
    def __init__(self, model: Path, *args: str, tmp: Path) -> None:
        self.model = model
        self.args = args
        self.tmp = tmp
        self.events_path = tmp / "events.jsonl"
        self.url = ""
        self.host = "127.0.0.1"
        self.port = 0
        self.proc: subprocess.Popen[str] | None = None
        self.stdout: list[str] = []

    def __enter__(self) -> ServerProcess:
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self._stderr = open(self.tmp / "server.stderr", "w+")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "swarm.cli",
                "serve",
                "--model",
                str(self.model),
                "--port",
                "0",
                "--events",
                str(self.events_path),
                *self.args,
            ],
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            cwd=ROOT,
            env=env,
        )
        line = self._read_line(START_TIMEOUT_S)
        match = re.search(r"http://([0-9.]+):(\d+)", line or "")
        if not match:
            self.__exit__(None, None, None)
            raise AssertionError(f"the server did not start: {line!r}\n{self.stderr()}")
        self.host, self.port = match.group(1), int(match.group(2))
        self.url = f"http://{self.host}:{self.port}"
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None and self.proc.stdout:
            self.proc.stdout.close()
        self._stderr.close()

    def _read_line(self, timeout: float) -> str | None:
        assert self.proc is not None and self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout):
                return None
        line = self.proc.stdout.readline()
        self.stdout.append(line)
        return line

    def stderr(self) -> str:
        self._stderr.flush()
        return (self.tmp / "server.stderr").read_text()

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM, then wait for the process to end; its exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    # ------------------------------------------------------------------ http

    def connect(self, timeout: float = 120) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def request(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        conn = self.connect()
        try:
            data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
            conn.request(method, path, body=data, headers={"content-type": "application/json", **(headers or {})})
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def events(self) -> list[Event]:
        """Every event the server has logged so far (its --events file), decoded."""
        if not self.events_path.exists():
            return []
        return [decode(line) for line in self.events_path.read_text().splitlines() if line.strip()]

    def wait_for_event(self, predicate: Callable[[Event], bool], timeout: float = 60) -> Event:
        """The first logged event matching `predicate`, polling the log (bounded)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.events():
                if predicate(event):
                    return event
            time.sleep(0.05)
        raise AssertionError(f"no matching event within {timeout} s; events: {self.events()[-20:]}")


class SSE:
    """A raw streaming request: read `data:` payloads one at a time, or hang up."""

    def __init__(
        self, server: ServerProcess, path: str, body: Any = None, headers: dict[str, str] | None = None, method: str = "POST"
    ) -> None:
        self.conn = server.connect()
        data = None if body is None else json.dumps(body).encode()
        self.conn.request(method, path, body=data, headers={"content-type": "application/json", **(headers or {})})
        self.response = self.conn.getresponse()
        self.status = self.response.status

    def __iter__(self) -> Iterator[str]:
        for raw in self.response:
            line = raw.decode().rstrip("\r\n")
            if line.startswith("data: "):
                yield line[len("data: ") :]

    def chunks(self) -> Iterator[dict[str, Any]]:
        for data in self:
            if data == "[DONE]":
                return
            yield json.loads(data)

    def hang_up(self) -> None:
        self.response.close()
        self.conn.close()


class EventWatcher:
    """Reads GET /v1/events in a thread, collecting every event it is sent."""

    def __init__(self, server: ServerProcess, headers: dict[str, str] | None = None) -> None:
        self.stream = SSE(server, "/v1/events", method="GET", headers=headers)
        self.events: list[Event] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for data in self.stream:
                self.events.append(decode(data))
        except (OSError, ValueError, http.client.HTTPException):
            pass  # hung up

    def close(self) -> None:
        # Shut the socket down under the reader (it sees the end of the stream),
        # and only then close it: closing it from here would pull it from under it.
        sock = self.stream.conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.thread.join(10)
        self.stream.hang_up()
