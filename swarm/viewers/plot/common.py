"""What both pictures share: saving a figure, and the constants of their axes."""

from __future__ import annotations

import os
from pathlib import Path

from matplotlib.figure import Figure

from runtime.errors import ConfigError

PERCENTILES = ("p50", "p90", "p99", "max")
FLOOR_MS = 1e-3  # log axes cannot show zero; a zero wait is drawn at 1 µs


def save(fig: Figure, out: str | os.PathLike[str]) -> Path:
    out = Path(out)
    if not out.parent.is_dir():
        raise ConfigError(f"cannot write {out}: the directory {out.parent} does not exist")
    try:
        fig.savefig(out, dpi=120)
    except ValueError as exc:  # an extension matplotlib cannot write
        raise ConfigError(f"cannot write {out}: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"cannot write {out}: {exc.strerror}") from None
    return out
