"""The README's two commands are what a new user and CI run: keep them in step."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    return re.findall(r"^    (bash scripts/setup-system\.sh && .+)$", (ROOT / "README.md").read_text(), re.M)


def test_ci_runs_the_readmes_test_command_character_for_character():
    commands = readme_commands()
    assert len(commands) == 2 and commands[1].endswith("python3 -m pytest")
    ci_lines = (ROOT / ".ci/run").read_text().splitlines()
    assert ci_lines[-1] == commands[1]


def test_the_system_setup_is_idempotent_and_quiet_when_everything_is_installed():
    # Run twice: the second run (and the first, on this machine) must change nothing.
    for _ in range(2):
        done = subprocess.run(["bash", str(ROOT / "scripts/setup-system.sh")], capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr
