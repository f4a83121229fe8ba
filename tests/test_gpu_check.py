"""scripts/gpu-check.sh's arguments: what a lease of a few minutes must not waste on a
typo. Its runs need a GPU and minutes; none runs here."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def gpu_check(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(ROOT / "scripts" / "gpu-check.sh"), *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_help_names_every_option_and_makes_nothing(tmp_path: Path) -> None:
    done = gpu_check("--help", cwd=tmp_path)
    assert done.returncode == 0 and "--out DIR" in done.stdout and "--against TREE" in done.stdout, done.stderr
    assert list(tmp_path.iterdir()) == []


def test_against_a_folder_that_is_no_checkout_says_so_in_one_line(tmp_path: Path) -> None:
    for folder in (tmp_path, tmp_path / "missing"):
        done = gpu_check("--out", str(tmp_path / "out"), "--against", str(folder), "model.gguf")
        assert done.returncode == 2 and done.stderr.strip() == f"--against: not a slotswarm checkout: {folder}"
    assert not (tmp_path / "out").exists()


def test_an_option_without_its_folder_says_so_in_one_line() -> None:
    for option in ("--out", "--against"):
        done = gpu_check(option)
        assert done.returncode != 0 and done.stderr.strip().endswith(f"{option} needs a folder")
        assert len(done.stderr.strip().splitlines()) == 1
