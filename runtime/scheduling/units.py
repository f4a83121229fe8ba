"""The small sums everyone needs, once: block counts, percentiles, durations."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

PERCENTILES = (50, 90, 99)


def ceil_div(n: int, d: int) -> int:
    """n / d rounded up: blocks for n positions, work-groups for n rows."""
    return -(-n // d)


def percentiles(samples: Sequence[float]) -> dict[str, float] | None:
    """p50 / p90 / p99 (linear interpolation, numpy's default) and max; None
    without samples."""
    if len(samples) == 0:
        return None
    a = np.asarray(samples, dtype=float)
    return {**{f"p{q}": float(np.percentile(a, q)) for q in PERCENTILES}, "max": float(a.max())}


def format_duration(seconds: float | None, ms_digits: int = 1) -> str:
    """ "12.3 ms" below a second (`ms_digits` after the point), "1.23 s" above;
    "-" for none."""
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.{ms_digits}f} ms" if seconds < 1 else f"{seconds:.2f} s"
