"""The page's tests in a real headless browser (swarm/viewers/watch/browser.py).

Nothing here waits a fixed time: `wait_for` polls a JavaScript expression until
it holds, with a generous bound, and says what the page held if it never did."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from swarm.viewers.watch.browser import close_chromium as close  # noqa: F401 (re-exported for the tests)
from swarm.viewers.watch.browser import open_chromium


def chromium():
    driver = open_chromium()
    driver.set_script_timeout(30)
    return driver


def wait_for(driver, expression: str, timeout: float = 60.0, poll: float = 0.02) -> Any:
    """The value of `expression` (JavaScript, evaluated in the page) once truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = driver.execute_script(f"try {{ return ({expression}); }} catch (e) {{ return null; }}")
        if value:
            return value
        if time.monotonic() > deadline:
            state = driver.execute_script("return window.swarmState ? JSON.stringify(window.swarmState) : null")
            short = json.dumps(json.loads(state), indent=None)[:3000] if state else None
            raise AssertionError(f"the page never got to `{expression}` in {timeout} s; swarmState: {short}")
        time.sleep(poll)


def state(driver) -> dict:
    return driver.execute_script("return JSON.parse(JSON.stringify(window.swarmState))")


ROOT = Path(__file__).parent.parent


def start_watch(*args: str, port: str = "0") -> tuple[subprocess.Popen, str]:
    """`swarm watch ARGS --port PORT` as its own process; returns it and its page's URL."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "swarm.cli", "watch", *args, "--port", port],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    first = proc.stderr.readline()
    found = re.search(r"http://127\.0\.0\.1:\d+/", first)
    if not found:
        proc.kill()
        raise AssertionError(f"swarm watch did not start: {first}{proc.stderr.read()}")
    return proc, found.group(0)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=30)
    proc.stderr.close()
