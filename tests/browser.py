"""A real headless browser for the page's tests: Debian's chromium, driven by
selenium through chromium-driver (scripts/setup-system.sh installs both).

Nothing here waits a fixed time: `wait_for` polls a JavaScript expression until
it holds, with a generous bound, and says what the page held if it never did."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from typing import Any

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,900",
]


def chromium():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser = shutil.which("chromium")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        raise RuntimeError("the page's tests need Debian's chromium and chromium-driver: run scripts/setup-system.sh")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="slotswarm-chromium-")
    options.add_argument(f"--user-data-dir={profile}")
    d = webdriver.Chrome(options=options, service=Service(driver))
    d.set_script_timeout(30)
    d._slotswarm_profile = profile  # removed by close()
    return d


def close(driver) -> None:
    try:
        driver.quit()
    finally:
        shutil.rmtree(driver._slotswarm_profile, ignore_errors=True)


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
