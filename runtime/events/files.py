"""Private files: what a swarm writes (its event log, the agents' proposals and
transcripts) may hold a user's code and prompts, so it is readable by its owner
only: files 0600, the folders made for them 0700, whatever the umask."""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any


def private_dir(path: str | Path) -> Path:
    """Make `path` and any missing parents, each new one 0700. Existing folders
    are left as they are (they are the user's)."""
    path = Path(path)
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            pass
        os.chmod(folder, 0o700)  # mkdir's mode is filtered by the umask
    return path


def open_private(path: str | Path, mode: str = "w", **kwargs: Any) -> IO[Any]:
    """open() that creates the file 0600 (an existing file keeps its mode)."""
    path = Path(path)
    private_dir(path.parent)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    return os.fdopen(fd, mode, **kwargs)


def write_private(path: str | Path, text: str) -> None:
    with open_private(path, "w", encoding="utf-8") as f:
        f.write(text)
