"""Where event sockets live: one per running swarm, in a private directory.

A swarm serves its events (runtime.events.stream) on `swarm-<pid>.sock` in
`$XDG_RUNTIME_DIR/slotswarm`, else `/tmp/slotswarm-<uid>`; a viewer finds the
running ones with `live_sockets`, skipping those a dead swarm left behind.
"""

from __future__ import annotations

import os
import socket
import stat
import tempfile
from pathlib import Path

from runtime.errors import ConfigError

# sockaddr_un.sun_path is 108 bytes on Linux, including the final NUL.
_MAX_SOCKET_PATH = 107


def default_socket_dir() -> Path:
    """Where running swarms put their sockets: `$XDG_RUNTIME_DIR/slotswarm` (a
    per-user tmpfs on most Linux desktops), else `/tmp/slotswarm-<uid>`."""
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR")
    if runtime_dir and Path(runtime_dir).is_dir():
        return Path(runtime_dir) / "slotswarm"
    return Path(tempfile.gettempdir()) / f"slotswarm-{os.getuid()}"


def default_socket_path() -> Path:
    """The socket this process would serve on: one per swarm, named by pid."""
    return default_socket_dir() / f"swarm-{os.getpid()}.sock"


def live_sockets(directory: Path | None = None) -> list[Path]:
    """Sockets of running swarms in `directory` (default: `default_socket_dir()`),
    newest first. Sockets left behind by a swarm that died are skipped."""
    directory = directory or default_socket_dir()
    try:
        candidates = [p for p in directory.glob("*.sock") if _is_socket(p)]
    except OSError:
        return []
    candidates.sort(key=_mtime, reverse=True)
    return [p for p in candidates if _accepts_connections(p)]


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(path.stat().st_mode)
    except OSError:
        return False


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _accepts_connections(path: Path) -> bool:
    # A socket file whose server died refuses connections: that is how we tell.
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(os.fsdecode(path))
        except OSError:
            return False
    return True


def prepare_socket_path(path: Path) -> None:
    """Make ready to serve on `path`: a short enough path, a private directory,
    and no live swarm or other file already there (ConfigError otherwise)."""
    if len(os.fsencode(path)) > _MAX_SOCKET_PATH:
        raise ConfigError(
            f"socket path {path} is {len(os.fsencode(path))} bytes long; "
            f"Unix sockets allow at most {_MAX_SOCKET_PATH}: choose a shorter path"
        )
    directory = path.parent
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the socket directory {directory}: {exc}") from exc
    if directory == default_socket_dir():
        _check_private(directory)
    if _is_socket(path) and _accepts_connections(path):
        raise ConfigError(f"another swarm is already serving events on {path}")
    if path.exists() and not _is_socket(path):
        raise ConfigError(f"{path} exists and is not a socket; refusing to replace it")


def _check_private(directory: Path) -> None:
    # /tmp is shared: someone else could have made our directory first, to watch.
    info = directory.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise ConfigError(f"{directory} is not a directory owned by you; refusing to serve events there")
    if info.st_mode & 0o077:
        os.chmod(directory, 0o700)
