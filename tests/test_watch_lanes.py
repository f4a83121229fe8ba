"""The lanes canvas in a real headless chromium: a frame repaints only the strip
its news touched (swarm/viewers/watch/static/lanes.js), and what the strips leave on
the canvas is what drawing it whole gives."""

from __future__ import annotations

import pytest
from browser import wait_for
from test_watch import on_page
from test_watch_hub import line, page_server

from swarm.viewers.watch import WatchHub

# The lanes as they are (drawing once more for any news since the last frame),
# against the whole canvas drawn again at once: pixels that differ, pixels in all.
# A stale strip differs by a whole colour somewhere (a run, a mark or a line too
# many or missing); a clipped fill's antialiased edge may round a level or two
# apart, which is no difference.
REDRAW_IN_FULL = """
const c = document.getElementById('lanes'), g = c.getContext('2d');
draw();
const strips = g.getImageData(0, 0, c.width, c.height).data;
sweep.key = '';
draw();
const full = g.getImageData(0, 0, c.width, c.height).data;
let differ = 0;
for (let i = 0; i < full.length; i += 4) {
  for (let k = 0; k < 4; k++) if (Math.abs(strips[i + k] - full[i + k]) > 8) { differ++; break; }
}
return { differ, pixels: full.length / 4 };
"""


def turn(event: str, n: int, t: float, **fields) -> bytes:
    agent = fields.pop("agent", "a" if n % 2 else "b")
    return line(event, t=t, turn=n, agent=agent, priority=fields.pop("priority", 0), **fields)


def ended(n: int, t: float, **fields) -> bytes:
    return turn("turn.finished", n, t, tokens=3, reason="stop", **fields)


# News in batches, each drawn before the next comes. Not live (the hub's status
# says so), the lanes end at the newest event, so what is drawn does not depend
# on when. Batches after the first hold news older than what the last frame
# drew ("late"), as a live page gets: runs end earlier than drawn, a resume
# links back to its pause.
BATCHES = [
    [
        turn("turn.queued", 1, 0.5, tokens=3),
        turn("turn.admitted", 1, 0.6, slot=0),
        turn("turn.queued", 2, 0.7, tokens=3),
        turn("turn.admitted", 2, 0.8, slot=1),
        turn("turn.queued", 3, 4.0, tokens=3, priority=10),
        # a band (a row of its own: the canvas grows now, not later, which would redraw it whole)
        line("priority.inherited", t=1.0, agent="b", priority=10, by_agent="a", base_priority=0),
    ],
    # late: turn 2 ended at 3; turn 3 takes slot 0 from turn 1 (a pause mark)
    [
        ended(2, 3.0),
        turn("turn.preempted", 1, 6.0, slot=0, tokens=2, by_turn=3, by_agent="a", by_priority=10),
        turn("turn.admitted", 3, 6.0, slot=0, priority=10),
    ],
    [turn("turn.queued", 4, 10.0, tokens=3)],
    # late: turn 3 ended at 8, turn 1 resumed in slot 1 at 8.5; the source
    # reconnected (a gap: a red line at the newest time)
    [ended(3, 8.0, priority=10), turn("turn.resumed", 1, 8.5, slot=1, paused_s=2.5), line("swarm.started", t=8.7, unix_time=5.0, slots=3)],
    # a run long enough for its label
    [turn("turn.admitted", 4, 11.0, slot=2), line("turn.queued", t=13.0, turn=9, agent="c", priority=0, tokens=1)],
    # late: the band ended at 12, turn 1 at 12.5
    [
        line("priority.restored", t=12.0, agent="b", priority=0, base_priority=0),
        ended(1, 12.5),
        line("turn.queued", t=14.0, turn=10, agent="c", priority=0, tokens=1),
    ],
    [ended(4, 14.5)],
]


@pytest.mark.asyncio
async def test_the_lanes_drawn_strip_by_strip_equal_them_drawn_whole(browser):
    hub = WatchHub(source="test")
    async with page_server(hub) as url:
        hub.publish(line("swarm.started", unix_time=5.0, slots=3))
        await on_page(browser.get, url)
        published = 1
        for batch in BATCHES:
            for event in batch:
                hub.publish(event)
            published += len(batch)
            await on_page(wait_for, browser, f"window.swarmState.counts.events + window.swarmState.counts.drop_notices == {published}")
            # Something the reader does is drawn at once (news waits a second or more).
            await on_page(browser.execute_script, "window.dispatchEvent(new Event('resize'))")
            await on_page(wait_for, browser, "page.model.redrawFrom === Infinity")
        drawing = await on_page(wait_for, browser, "window.swarmState.drawing")
        redrawn = await on_page(browser.execute_script, REDRAW_IN_FULL)
    # Most frames drew only a strip (else the comparison says nothing) ...
    assert drawing["lanes_full"] < drawing["lanes_frames"] - 2
    assert drawing["lanes_pixels"] < drawing["lanes_frames"] * redrawn["pixels"] / 2
    # ... and what they left on the canvas is what drawing it whole gives.
    assert redrawn["differ"] == 0
