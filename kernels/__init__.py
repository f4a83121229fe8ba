"""OpenCL C sources for the decode engine, shipped as package data.

`source(name)` returns the text of `kernels/<name>.cl`.
"""

from __future__ import annotations

from importlib import resources


def source(name: str) -> str:
    """The OpenCL C source of `kernels/<name>.cl`."""
    path = resources.files(__name__) / f"{name}.cl"
    if not path.is_file():
        raise FileNotFoundError(f"no kernel source named {name!r} (looked for {path})")
    return path.read_text(encoding="utf-8")
