"""The tree keeps to the project's ruff configuration (pyproject.toml): lint
rules and formatting, both checked from the repository root."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def ruff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_finds_nothing_to_fix() -> None:
    result = ruff("check", ".", "--output-format", "concise")
    assert result.returncode == 0, f"ruff check . failed:\n{result.stdout}{result.stderr}"


def test_the_tree_is_formatted() -> None:
    result = ruff("format", "--check", ".")
    assert result.returncode == 0, f"ruff format --check . failed (run `ruff format .`):\n{result.stdout}{result.stderr}"
