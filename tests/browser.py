"""The page's tests in a real headless browser (swarm/watch/browser.py).

Nothing here waits a fixed time: `wait_for` polls a JavaScript expression until
it holds, with a generous bound, and says what the page held if it never did."""

from __future__ import annotations

import json
import time
from typing import Any

from swarm.watch.browser import close_chromium as close  # noqa: F401 (re-exported for the tests)
from swarm.watch.browser import open_chromium


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
