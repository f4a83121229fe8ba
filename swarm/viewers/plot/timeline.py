"""The slot timeline of a session, drawn from its events (the model: swarm.viewers.plot.spans).

One row per slot; each stretch a turn ran in a slot is a bar in its agent's
colour, pale for background turns and solid with a black edge for foreground ones
(priority >= FOREGROUND when queued). A paused turn holds no slot, so its pause is
drawn hatched on a lane of its own agent below the slots. Each foreground wait
(queued -> admitted) is a dark line on the slot it got, ending in a tick labelled
with the wait. Preemptions are small red triangles. Priority lent by a waiter is
a band on a lane of the agent it was lent to, naming the waiter, as on the live
page (swarm watch).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from runtime.errors import ConfigError
from runtime.events.kinds import Event
from runtime.scheduling.units import format_duration, percentiles
from swarm.viewers.plot.common import save
from swarm.viewers.plot.spans import Span, Timeline, build_timeline, foreground_answers

__all__ = ["Timeline", "build_timeline", "draw_timeline", "foreground_answers", "plot_timeline"]

MAX_WAIT_LABELS = 40  # label at most this many foreground waits (the longest)
MAX_TURN_LABELS = 200  # and at most this many turns by number
MAX_PAUSE_LEVELS = 6  # turns of one agent paused at once, stacked in its lane
LENT_FILL, LENT_EDGE, LENT_TEXT = (0.78, 0.24, 0.78, 0.25), "#aa33aa", "#660066"  # the page's colours


# ---------------------------------------------------------------- drawing


def plot_timeline(events: list[Event], out: str | os.PathLike[str], title: str | None = None) -> Path:
    return save(draw_timeline(events, title), out)


def draw_timeline(events: list[Event], title: str | None = None) -> Figure:
    tl = build_timeline(events)
    if not tl.runs and not tl.pauses:
        raise ConfigError("no turn ever got a slot in these events: nothing to draw")
    colours = _agent_colours(tl.agents)
    paused_agents = [a for a in tl.agents if any(p.agent == a for p in tl.pauses)]
    lifted_agents = list(dict.fromkeys(b.agent for b in tl.bands))
    # Rows top to bottom: slot 0..n-1, one paused lane per agent that paused, one
    # lifted lane per agent lent a priority.
    labels = (tl.lane_names or [f"slot {s}" for s in range(tl.slots)]) + [f"{a} paused" for a in paused_agents]
    labels += [f"{a} lifted" for a in lifted_agents]
    row = {("slot", s): i for i, s in enumerate(range(tl.slots))}
    row.update({("paused", a): tl.slots + i for i, a in enumerate(paused_agents)})
    row.update({("lifted", a): tl.slots + len(paused_agents) + i for i, a in enumerate(lifted_agents)})

    answers = foreground_answers(events)
    height = 1.6 + 0.45 * len(labels)
    fig = Figure(figsize=(12, height + (3 if answers else 0)), layout="constrained")
    grid = fig.add_gridspec(2, 1, height_ratios=[height, 3]) if answers else None
    ax = fig.add_subplot(grid[0]) if grid is not None else fig.add_subplot()
    _draw_runs(ax, tl, row, colours)
    _draw_pauses(ax, tl, row, colours)
    if tl.preemptions:
        ax.scatter(
            [t for t, _ in tl.preemptions],
            [row[("slot", s)] - 0.42 for _, s in tl.preemptions],
            marker="v",
            s=18,
            color="red",
            zorder=3,
        )
    _draw_waits(ax, tl, row)
    _draw_bands(ax, tl, row)

    ax.set_yticks(range(len(labels)), labels)
    ax.set_ylim(len(labels) - 0.5, -0.7)  # slot 0 on top
    ax.set_xlim(tl.start, tl.end + (tl.end - tl.start) * 0.02 + 1e-6)
    ax.set_xlabel("time since the swarm started (s)")
    ax.grid(axis="x", alpha=0.3)
    if tl.slots < len(labels):
        ax.axhline(tl.slots - 0.5, color="grey", linewidth=0.8)
    ax.set_title(title or _timeline_title(tl))
    handles = [Patch(facecolor=colours[a], label=a) for a in tl.agents]
    handles += [
        Patch(facecolor="grey", edgecolor="black", linewidth=1.2, label="foreground turn"),
        Patch(facecolor="grey", alpha=0.45, label="background turn"),
        Patch(facecolor="white", edgecolor="grey", hatch="///", label="paused (holds no slot)"),
        Line2D([], [], color="black", marker="|", label="foreground wait"),
        Line2D([], [], color="red", marker="v", linestyle="none", label="preemption"),
    ]
    if tl.bands:
        handles.append(Patch(facecolor=LENT_FILL, edgecolor=LENT_EDGE, label="lent priority"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    if grid is not None:
        below = fig.add_subplot(grid[1], sharex=ax)
        for turn, agent, times in answers:
            below.step(
                [times[0] - 1e-9, *times],
                range(len(times) + 1),
                where="post",
                color=colours.get(agent, "black"),
                label=f"{agent} turn {turn}",
            )
        below.set_ylabel("tokens received")
        below.set_title("foreground turns' tokens over time")
        below.grid(alpha=0.3)
    return fig


def _draw_runs(ax: Any, tl: Timeline, row: dict, colours: dict) -> None:
    # One collection per (slot, agent, kind), not one per span: thousands of
    # turns still draw in a second or two.
    groups: dict[tuple[int, str, bool], list[tuple[float, float]]] = {}
    for span in tl.runs:
        if span.slot is not None:
            groups.setdefault((span.slot, span.agent, span.foreground), []).append((span.start, max(span.end - span.start, 1e-9)))
    for (slot, agent, fg), xranges in groups.items():
        ax.broken_barh(
            xranges,
            (row[("slot", slot)] - 0.35, 0.7),
            facecolors=colours[agent],
            alpha=1.0 if fg else 0.45,
            edgecolors="black" if fg else "white",  # white: turns back to back stay apart
            linewidths=1.2 if fg else 0.6,
        )
    # Name the turns wide enough to hold a label, to match them with `swarm tail`.
    wide = (tl.end - tl.start) * 0.04
    spans = [s for s in tl.runs if s.slot is not None and s.end - s.start >= wide]
    for span in spans[:MAX_TURN_LABELS]:
        ax.text(
            (span.start + span.end) / 2,
            row[("slot", span.slot)],
            f"t{span.turn}",
            ha="center",
            va="center",
            fontsize=6,
            color="white" if span.foreground else "black",
            clip_on=True,
        )


def _draw_pauses(ax: Any, tl: Timeline, row: dict, colours: dict) -> None:
    # Turns of one agent can be paused at the same time: stack them in its lane.
    by_agent: dict[str, list[Span]] = {}
    for span in sorted(tl.pauses, key=lambda p: p.start):
        by_agent.setdefault(span.agent, []).append(span)
    for agent, spans in by_agent.items():
        level_ends: list[float] = []
        levels: dict[int, list[tuple[float, float]]] = {}
        for span in spans:
            level = next((i for i, end in enumerate(level_ends) if end <= span.start), len(level_ends))
            if level == len(level_ends):
                level_ends.append(span.end)
            level_ends[level] = span.end
            # Past a few levels stacking is unreadable; deeper ones share (and overlap).
            levels.setdefault(level % MAX_PAUSE_LEVELS, []).append((span.start, max(span.end - span.start, 1e-9)))
        height = 0.6 / min(len(level_ends), MAX_PAUSE_LEVELS)
        for level, xranges in levels.items():
            ax.broken_barh(
                xranges,
                (row[("paused", agent)] - 0.3 + level * height + height * 0.1, height * 0.8),
                facecolors="white",
                edgecolors=colours[agent],
                hatch="///",
                linewidths=0.8,
            )


def _draw_waits(ax: Any, tl: Timeline, row: dict) -> None:
    if not tl.waits:
        return
    ys = [row[("slot", w.slot)] + 0.42 for w in tl.waits]
    ax.hlines(ys, [w.queued for w in tl.waits], [w.admitted for w in tl.waits], color="black", linewidth=1.0, zorder=3)
    ax.plot([w.admitted for w in tl.waits], ys, color="black", marker="|", markersize=9, linestyle="none", zorder=3)
    for w in sorted(tl.waits, key=lambda w: w.waited, reverse=True)[:MAX_WAIT_LABELS]:
        # Above the wait's line and left of its tick: inside the slot's own lane
        # (the line runs along its foot), never over the lane below.
        ax.annotate(
            format_duration(w.waited),
            (w.admitted, row[("slot", w.slot)] + 0.42),
            xytext=(-2, 1),
            textcoords="offset points",
            fontsize=7,
            ha="right",
            va="bottom",
        )


def _draw_bands(ax: Any, tl: Timeline, row: dict) -> None:
    for band in tl.bands:
        y = row[("lifted", band.agent)]
        ax.broken_barh(
            [(band.start, max(band.end - band.start, 1e-9))],
            (y - 0.3, 0.6),
            facecolors=LENT_FILL,
            edgecolors=LENT_EDGE,
            linewidths=0.8,
            gid="lent priority",
        )
        ax.annotate(
            f"p{band.priority}: {band.by_agent} waits on it",
            (band.start, y),
            xytext=(3, 0),
            textcoords="offset points",
            ha="left",
            va="center",
            fontsize=6,
            color=LENT_TEXT,
            annotation_clip=True,
            clip_on=True,
            gid="lent priority",
        )


def _timeline_title(tl: Timeline) -> str:
    parts = []
    if tl.started is not None:
        parts.append(f"policy {tl.started.policy}" if tl.started.policy else "")
        parts.append(tl.started.model or "")
    parts.append(f"{tl.slots} slots, {len({s.turn for s in tl.runs})} turns")
    if tl.waits:
        waited = percentiles([w.waited for w in tl.waits])
        parts.append(f"foreground wait p50 {format_duration(waited['p50'])}, max {format_duration(waited['max'])}")
    return " · ".join(p for p in parts if p)


def _agent_colours(agents: list[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if len(agents) <= 10 else "tab20"]
    return {a: cmap(i % cmap.N) for i, a in enumerate(agents)}
