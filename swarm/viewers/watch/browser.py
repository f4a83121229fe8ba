"""A real headless browser for the page: Debian's chromium, driven by selenium
through chromium-driver (scripts/setup-system.sh installs both). Used by the
page's tests and by `swarm bench watch`; selenium is imported only here."""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

from runtime.errors import ConfigError

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,800",
]


def open_chromium() -> Any:
    """A selenium driver for a fresh headless chromium (its own empty profile)."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        raise ConfigError("this needs selenium: pip install -e '.[test]'") from None

    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not browser or not driver:
        raise ConfigError("this needs Debian's chromium and chromium-driver: run scripts/setup-system.sh")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in FLAGS:
        options.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="slotswarm-chromium-")
    options.add_argument(f"--user-data-dir={profile}")
    try:
        chromium = webdriver.Chrome(options=options, service=Service(driver))
    except Exception:
        shutil.rmtree(profile, ignore_errors=True)
        raise
    chromium.slotswarm_profile = profile
    return chromium


def close_chromium(chromium: Any) -> None:
    try:
        chromium.quit()
    finally:
        shutil.rmtree(chromium.slotswarm_profile, ignore_errors=True)
