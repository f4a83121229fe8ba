"""The foreground-wait distribution per policy, from bench results.

`{"policies": {name: {"fg_wait_s": {"p50", "p90", "p99", "max"}, ...}}}`; with raw
samples (`"fg_wait_samples_s"`, a list per policy) each policy's distribution is
drawn as an ECDF on a log axis, otherwise the percentiles as bars.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from runtime.errors import ConfigError
from swarm.viewers.plot.common import FLOOR_MS, PERCENTILES, save

# ---------------------------------------------------------------- bench results


def plot_bench(data: dict, out: str | os.PathLike[str], title: str | None = None) -> Path:
    policies = _policies(data)
    samples = _samples(data, policies)
    turns = _token_times(data)
    fig = Figure(figsize=(9, 9 if turns else 5), layout="constrained")
    ax = fig.add_subplot(2, 1, 1) if turns else fig.add_subplot()
    if samples:
        _draw_ecdf(ax, policies, samples)
    else:
        _draw_percentile_bars(ax, policies)
    ax.set_title(title or _bench_title(data))
    if turns:
        _draw_token_times(fig.add_subplot(2, 1, 2), turns)
    return save(fig, out)


def _token_times(data: dict) -> dict[str, list[float]]:
    """Per policy (and solo), the token times of its median foreground turn (by
    turn time), from `fg_token_times_s` where the bench recorded them."""
    runs = {name: r for name, r in data["policies"].items() if name in _policies(data)}
    if isinstance(data.get("solo"), dict):
        runs = {"solo (idle engine)": data["solo"], **runs}
    found = {}
    for name, result in runs.items():
        turns = result.get("fg_token_times_s") if isinstance(result, dict) else None
        turns = [t for t in turns or () if isinstance(t, list) and t and all(isinstance(v, (int, float)) for v in t)]
        if turns:
            found[name] = sorted(turns, key=lambda t: t[-1])[len(turns) // 2]
    return found


def _draw_token_times(ax: Any, turns: dict[str, list[float]]) -> None:
    """What the person sees: tokens arriving over time, one line per policy."""
    for i, (name, times) in enumerate(turns.items()):
        solo = name.startswith("solo")
        ax.step(
            [0.0, *times],
            range(len(times) + 1),
            where="post",
            color="black" if solo else f"C{(i - 1) % 10}",
            linestyle="--" if solo else "-",
            label=f"{name}: {len(times)} tokens in {times[-1]:.2f} s",
        )
    ax.set_xlabel("seconds since the request (the median foreground turn by turn time)")
    ax.set_ylabel("tokens received")
    ax.set_title("the foreground turn's tokens over time")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")


def _bench_title(data: dict) -> str:
    workload = data.get("workload") if isinstance(data.get("workload"), dict) else {}
    facts = [f"{workload[k]} {label}" for k, label in (("slots", "slots"), ("arrivals", "arrivals")) if k in workload]
    return " · ".join(["foreground wait per policy", *facts])


def _policies(data: dict) -> dict[str, dict[str, float]]:
    policies = data.get("policies")
    if not isinstance(policies, dict) or not policies:
        raise ConfigError("bench results: 'policies' must be an object with one entry per policy")
    table = {}
    for name, result in policies.items():
        waits = result.get("fg_wait_s") if isinstance(result, dict) else None
        if waits is None and isinstance(result, dict) and "fg_wait_s" in result:
            continue  # no foreground turn finished under this policy: nothing to draw
        if not isinstance(waits, dict) or not all(isinstance(waits.get(k), (int, float)) for k in PERCENTILES):
            raise ConfigError(f"bench results: policy {name!r} lacks fg_wait_s with {', '.join(PERCENTILES)}")
        table[name] = {k: float(waits[k]) for k in PERCENTILES}
    if not table:
        raise ConfigError("bench results: no policy finished a foreground turn, nothing to plot")
    return table


def _samples(data: dict, policies: dict) -> dict[str, list[float]]:
    # Per policy (policies.<name>.fg_wait_samples_s), or one top-level map.
    top = data.get("fg_wait_samples_s") if isinstance(data.get("fg_wait_samples_s"), dict) else {}
    found = {}
    for name in policies:
        values = data["policies"][name].get("fg_wait_samples_s", top.get(name))
        if isinstance(values, list) and values:
            if not all(isinstance(v, (int, float)) and v >= 0 for v in values):
                raise ConfigError(f"bench results: {name}.fg_wait_samples_s must be non-negative numbers")
            found[name] = [float(v) for v in values]
    return found


def _draw_ecdf(ax: Any, policies: dict, samples: dict[str, list[float]]) -> None:
    for i, name in enumerate(policies):
        colour = f"C{i % 10}"
        if name in samples:
            ms = sorted(max(v * 1000, FLOOR_MS) for v in samples[name])
            n = len(ms)
            ax.step(ms, [(k + 1) / n for k in range(n)], where="post", color=colour, label=f"{name} (n={n})")
        else:  # only the summary: its percentiles as points on the same axes
            points = [max(policies[name][k] * 1000, FLOOR_MS) for k in PERCENTILES]
            ax.plot(points, [0.5, 0.9, 0.99, 1.0], "o--", color=colour, label=f"{name} (percentiles)")
    ax.set_xscale("log")
    ax.set_xlabel("foreground wait, queued -> admitted (ms, log; a zero wait is drawn at 1 µs)")
    ax.set_ylabel("fraction of foreground turns")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small")


def _draw_percentile_bars(ax: Any, policies: dict) -> None:
    width = 0.8 / len(PERCENTILES)
    for j, key in enumerate(PERCENTILES):
        xs = [i + (j - (len(PERCENTILES) - 1) / 2) * width for i in range(len(policies))]
        heights = [max(p[key] * 1000, FLOOR_MS) for p in policies.values()]
        ax.bar(xs, heights, width, label=key, color=f"C{j}")
    ax.set_xticks(range(len(policies)), list(policies))
    ax.set_yscale("log")
    ax.set_ylabel("foreground wait (ms, log; zero drawn at 1 µs)")
    top = max(max(p.values()) for p in policies.values()) * 1000
    ax.set_ylim(FLOOR_MS / 2, max(top, FLOOR_MS) * 3)
    ax.grid(axis="y", alpha=0.3, which="both")
    ax.legend(title="percentile", fontsize="small")
