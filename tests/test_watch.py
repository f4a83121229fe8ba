"""`swarm watch`: the page in a real headless chromium (the hub's stream alone is
tests/test_watch_hub.py).

The browser is waited on by polling `window.swarmState` with generous bounds,
never by sleeping: what is asserted is what the page holds, not how fast it
got there. (The one bound on time is the issue's own: a pause mark is on the
page within one second of its event, measured by the page itself.)"""

from __future__ import annotations

from functools import partial

import anyio
import msgspec
import pytest
from browser import start_watch, state, stop, wait_for
from test_watch_hub import line, page_server

from runtime.events.kinds import Dropped, Finished, read_events
from runtime.events.stream import encode_line
from runtime.scheduling.priority import BACKGROUND, FOREGROUND
from runtime.scheduling.timing import TimingEngine
from runtime.scheduling.units import percentiles
from swarm import Agent, Swarm, handler
from swarm.runner import SessionRunner
from swarm.session import DEMO_SESSION, load_session
from swarm.summary import summarize
from swarm.viewers.plot import build_timeline
from swarm.viewers.watch import WatchHub, bind_loopback, follow_bus

LONG = 1_000_000  # a background turn that never ends within a test


# ------------------------------------------------------------------ the browser


async def on_page(fn, *args, **kwargs):
    """Run a blocking browser call in a worker thread: the swarm and the page
    server keep running on this event loop meanwhile."""
    return await anyio.to_thread.run_sync(partial(fn, *args, **kwargs))


class Background(Agent):
    async def run(self) -> None:
        async with self.generate([1, 2, 3], max_tokens=LONG, ignore_eos=True) as turn:
            async for _ in turn:
                pass


class Foreground(Agent):
    async def run(self) -> None:
        await self.complete([4, 5], max_tokens=20, ignore_eos=True)


@pytest.mark.asyncio
async def test_a_forced_preemption_shows_as_a_pause_mark_within_one_second(browser):
    hub = WatchHub(source="test")
    with anyio.fail_after(120):
        async with page_server(hub) as url:
            await on_page(browser.get, url)  # before the swarm exists
            await on_page(wait_for, browser, "window.swarmState.connected")
            swarm = Swarm(TimingEngine(realtime=True), slots=2)
            async with anyio.create_task_group() as tg, swarm:
                await tg.start(follow_bus, hub, swarm.bus)  # ends when the swarm does
                for i in range(2):
                    await swarm.spawn(Background(f"bg{i}"))
                await on_page(wait_for, browser, "window.swarmState.slots.length == 2 && window.swarmState.slots.every(s => s)")
                await swarm.spawn(Foreground("pair", FOREGROUND))
                (pause,) = await on_page(wait_for, browser, "window.swarmState.pauses.filter(p => p.shown_at)")
                resumed = await on_page(wait_for, browser, "window.swarmState.pauses.filter(p => p.resumed_t !== null)")
                shown = state(browser)
    assert pause["by_agent"] == "pair" and pause["agent"].startswith("bg")
    latency_ms = pause["shown_at"] - pause["event_wall_ms"]
    print(f"pause mark on the page {latency_ms:.0f} ms after its event")
    assert latency_ms <= 1000
    # The pause is linked to where the turn resumed, after the foreground turn ended.
    assert resumed[0]["turn"] == pause["turn"] and resumed[0]["resumed_slot"] in (0, 1)
    assert shown["counts"]["preemptions"] == 1 and shown["agents"]["pair"]["turns"] == 1


class Review(msgspec.Struct):
    path: str


class Reviewer(Agent):
    def __init__(self, name: str, gate: anyio.Event) -> None:
        super().__init__(name)
        self.gate = gate

    @handler
    async def review(self, msg: Review) -> str:
        await self.gate.wait()  # held until the test has seen the band
        return await self.complete([7, 7], max_tokens=3, ignore_eos=True)


class Asker(Agent):
    async def run(self) -> None:
        await self.ask("reviewer", Review("pricing.py"), timeout=60)


@pytest.mark.asyncio
async def test_an_inheritance_band_appears_naming_the_waiter_and_clears(browser):
    hub = WatchHub(source="test")
    gate = anyio.Event()
    with anyio.fail_after(120):
        async with page_server(hub) as url:
            swarm = Swarm(TimingEngine(realtime=True), slots=1)
            async with anyio.create_task_group() as tg, swarm:
                await tg.start(follow_bus, hub, swarm.bus)
                await swarm.spawn(Reviewer("reviewer", gate))
                await on_page(browser.get, url)  # after the swarm started
                await swarm.spawn(Asker("pair", FOREGROUND))
                (band,) = await on_page(wait_for, browser, "window.swarmState.inheritances.filter(b => b.shown_at && b.end === null)")
                lifted = state(browser)["agents"]["reviewer"]
                gate.set()
                (cleared,) = await on_page(wait_for, browser, "window.swarmState.inheritances.filter(b => b.end !== null)")
                after = state(browser)["agents"]["reviewer"]
    assert (band["agent"], band["by_agent"], band["priority"]) == ("reviewer", "pair", FOREGROUND)
    assert (lifted["inherited_by"], lifted["priority"], lifted["base_priority"]) == ("pair", FOREGROUND, BACKGROUND)
    assert cleared["end"] >= cleared["start"] and after["inherited_by"] is None and after["priority"] == BACKGROUND


@pytest.mark.asyncio
async def test_unknown_event_kinds_are_ignored_and_a_drop_is_shown(browser):
    hub = WatchHub(source="test")
    async with page_server(hub) as url:
        hub.publish(line("swarm.started", unix_time=5.0, slots=3))
        await on_page(browser.get, url)
        hub.publish(b'{"event":"gpu.thermal","t":0.1,"step":1,"celsius":90}')
        hub.publish(b"not json at all")
        hub.publish(encode_line(Dropped(7)))
        hub.publish(line("turn.queued", t=0.2, turn=1, agent="a", priority=0, tokens=3))
        shown = await on_page(wait_for, browser, "window.swarmState.counts.turns == 1 && window.swarmState")
        badge = await on_page(wait_for, browser, "!document.getElementById('drops').hidden && document.getElementById('drops').textContent")
    assert shown["counts"]["unknown"] == 1 and shown["counts"]["dropped"] == 7 and len(shown["slots"]) == 3
    assert "lost: 7" in badge


DISPLAYED = "getComputedStyle(document.getElementById('replay')).display"


@pytest.mark.asyncio
async def test_the_replay_controls_show_on_a_replay_and_not_on_a_live_page(browser):
    for mode, shown in (("live", "none"), ("replay", "flex")):
        hub = WatchHub(mode=mode, source="test")
        async with page_server(hub) as url:
            hub.publish(line("swarm.started", unix_time=5.0, slots=2))
            await on_page(browser.get, url)
            await on_page(wait_for, browser, f"window.swarmState.mode == '{mode}'")
            assert await on_page(browser.execute_script, f"return {DISPLAYED}") == shown, mode


@pytest.mark.asyncio
async def test_an_agents_tokens_count_before_its_turn_ends(browser):
    hub = WatchHub(source="test")
    turn = dict(turn=1, agent="bg", priority=BACKGROUND)
    cell = "document.getElementById('agent-rows').rows[0].cells[4].textContent"
    async with page_server(hub) as url:
        hub.publish(line("swarm.started", unix_time=5.0, slots=1))
        await on_page(browser.get, url)
        hub.publish(line("turn.queued", t=0.1, **turn, tokens=3))
        hub.publish(line("turn.admitted", t=0.2, **turn, slot=0))
        hub.publish(line("turn.preempted", t=1.0, **turn, slot=0, tokens=5, by_turn=2, by_agent="fg", by_priority=FOREGROUND))
        await on_page(wait_for, browser, "window.swarmState.agents.bg && window.swarmState.agents.bg.tokens == 5")
        assert await on_page(wait_for, browser, f"{cell} == '5' && {cell}")  # the table, too
        hub.publish(line("turn.resumed", t=2.0, **turn, slot=0, paused_s=1.0))
        hub.publish(line("turn.finished", t=3.0, **turn, slot=0, tokens=12, reason="length"))
        ended = await on_page(wait_for, browser, "window.swarmState.counts.finished == 1 && window.swarmState.agents.bg")
        assert ended["tokens"] == 12  # the end's count replaces the live one, not added to it
        assert await on_page(wait_for, browser, f"{cell} == '12' && {cell}")


@pytest.mark.asyncio
async def test_a_turn_never_paused_counts_its_tokens_on_the_page_while_it_runs(browser):
    """turn.progress: a running swarm's one long turn, never paused, shows a
    growing token count in the agents table long before it ends."""
    hub = WatchHub(source="test")
    cell = "document.getElementById('agent-rows').rows[0].cells[4].textContent"
    with anyio.fail_after(120):
        async with page_server(hub) as url:
            await on_page(browser.get, url)
            await on_page(wait_for, browser, "window.swarmState.connected")
            async with anyio.create_task_group() as tg, Swarm(TimingEngine(realtime=True), slots=1) as swarm:
                await tg.start(follow_bus, hub, swarm.bus)  # ends when the swarm does
                await swarm.spawn(Background("bg"))
                first = int(await on_page(wait_for, browser, f"Number({cell}) > 0 && {cell}"))
                later = int(await on_page(wait_for, browser, f"Number({cell}) > {first} && {cell}"))
                shown = state(browser)
    assert 0 < first < later < LONG
    assert shown["counts"]["finished"] == 0 and shown["counts"]["preemptions"] == 0 and shown["counts"]["unknown"] == 0
    assert shown["agents"]["bg"]["tokens"] >= later


@pytest.mark.asyncio
async def test_the_window_all_fits_a_recording_and_a_stopped_swarm(browser):
    pick_all = "const w = document.getElementById('window'); w.value = '0'; w.onchange();"
    # A frame due before the pick still draws the 30 s window: wait for one drawn after it.
    drawn_all = (
        "window.swarmState.drawing.frames > {frames}"
        " && window.swarmState.drawing.axis[1] - window.swarmState.drawing.axis[0] != 30"
        " && window.swarmState.drawing"
    )
    hub = WatchHub(mode="replay", source="test")
    async with page_server(hub) as url:
        hub.publish(line("swarm.started", unix_time=5.0, slots=1))
        hub.publish(line("turn.queued", t=0.5, turn=1, agent="a", priority=0, tokens=3))
        hub.publish(line("turn.admitted", t=0.6, turn=1, agent="a", priority=0, slot=0))
        hub.publish(line("turn.finished", t=41.8, turn=1, agent="a", priority=0, slot=0, tokens=9, reason="length"))
        await on_page(browser.get, url)
        await on_page(wait_for, browser, "window.swarmState.replay && window.swarmState.replay.loaded == 4")
        for moment in ("at the start", "at the end"):
            if moment == "at the end":
                await on_page(browser.find_element("id", "to-end").click)
            frames = (await on_page(state, browser))["drawing"]["frames"]
            await on_page(browser.execute_script, pick_all)
            drawn = await on_page(wait_for, browser, drawn_all.format(frames=frames))
            assert drawn["axis"] == pytest.approx([0.0, 41.8]), moment
    hub = WatchHub(source="test")  # live, until the swarm stops
    async with page_server(hub) as url:
        hub.publish(line("swarm.started", unix_time=6.0, slots=1))
        hub.publish(line("turn.queued", t=0.5, turn=1, agent="a", priority=0, tokens=3))
        hub.publish(line("swarm.stopped", t=41.8, unix_time=47.8))
        await on_page(browser.get, url)
        await on_page(wait_for, browser, "window.swarmState.stopped")
        frames = (await on_page(state, browser))["drawing"]["frames"]
        await on_page(browser.execute_script, pick_all)
        drawn = await on_page(wait_for, browser, drawn_all.format(frames=frames))
        assert drawn["axis"] == pytest.approx([0.0, 41.8])


@pytest.mark.asyncio
async def test_a_page_whose_run_ended_and_took_its_server_says_only_that_it_stopped(browser):
    hub = WatchHub(source="swarm run")
    async with page_server(hub) as url:
        hub.set_status("live", live=True)
        hub.publish(line("swarm.started", unix_time=5.0, slots=1, policy="resident"))
        await on_page(browser.get, url)
        await on_page(wait_for, browser, "window.swarmState.connected && window.swarmState.status.live")
        hub.publish(line("swarm.stopped", t=3.0, unix_time=8.0))
        hub.set_status("the swarm stopped", live=False)
        await on_page(wait_for, browser, "window.swarmState.stopped && !window.swarmState.status.live")
    # The run is over and its page server gone, as at the end of `swarm run --watch`.
    await on_page(wait_for, browser, "!window.swarmState.connected")
    header = await on_page(
        wait_for,
        browser,
        "document.getElementById('status').textContent != 'the swarm stopped' && document.querySelector('header').textContent",
    )
    assert "stopped" in header and "reconnecting" not in header and "disconnected" not in header, header


# ------------------------------------------------ the demo with a page open


@pytest.fixture(scope="module")
def demo_run(browser, tiny_gguf, tmp_path_factory):
    """The built-in demo on the tiny model, as `swarm run --watch` runs it, with
    the page opened before the swarm starts; what the page showed, and the run's
    events file."""
    from gpu.engine import OpenCLEngine

    session = load_session(DEMO_SESSION)
    session.out = str(tmp_path_factory.mktemp("demo"))
    session.interval, session.duration = 0.2, 120
    # Short files: a review prompt must fit the tiny model's 512-token context.
    session.script = ["what does report.py do?", "review inventory.py", "what is a dataclass?"]
    for spec in session.agents:
        spec.options = {**spec.options, "max_tokens": 8, **({"max_file_chars": 300} if spec.class_ == "reviewer" else {})}
    runner = SessionRunner(session, engine=OpenCLEngine(tiny_gguf), page_sockets=[bind_loopback(0)])
    seen = {}

    async def run_with_a_page_open() -> None:
        with anyio.fail_after(240):
            async with anyio.create_task_group() as tg:
                tg.start_soon(runner.run)
                await on_page(browser.get, runner.page_urls[0])
                seen["lanes"] = await on_page(wait_for, browser, "window.swarmState.slots.filter(s => s).length >= 2 && window.swarmState")
                seen["drawn"] = await on_page(
                    wait_for, browser, "window.swarmState.drawn_lanes == 8 && document.getElementById('lanes').clientHeight"
                )
        seen["final"] = wait_for(browser, "window.swarmState.stopped && window.swarmState")

    anyio.run(run_with_a_page_open)
    return {"events": runner.events_path, "slots": session.slots, "agents": runner.agents, **seen}


def test_the_demo_on_the_tiny_model_with_a_page_open_has_one_lane_per_slot(demo_run):
    lanes = demo_run["lanes"]
    assert demo_run["slots"] == 8 and len(lanes["slots"]) == 8 and lanes["started"]["slots"] == 8
    assert demo_run["drawn"] >= 8 * 26  # the canvas drew eight lanes
    busy = [s for s in lanes["slots"] if s]
    assert all(s["agent"] in lanes["agents"] for s in busy)
    # Followed live from before the start, the page ends where the events file does.
    events = list(read_events(demo_run["events"]))
    summary = summarize(events)
    final = demo_run["final"]
    assert final["counts"]["events"] == len(events) and final["counts"]["drop_notices"] == 0
    assert final["counts"]["preemptions"] == summary.preemptions
    assert final["counts"]["inheritances"] == summary.inheritances >= 1  # the review lends foreground priority
    assert {n: r["tokens"] for n, r in final["agents"].items()} == {n: a.tokens for n, a in summary.agents.items()}
    assert final["latency"]["ttft"]["n"] >= 1
    assert final["latency"]["itl"]["n"] == len(summarize(events, demo_run["agents"]).fg_itl_s) > 1


# ----------------------------------------------- swarm watch: socket and replay


@pytest.mark.parametrize("recording", ["made-up", "tiny-model"])
def test_replaying_a_recording_reaches_the_counts_of_swarm_plot_and_the_run_summary(browser, recording, request):
    path = request.getfixturevalue("events_file" if recording == "made-up" else "demo_run")
    path = path if recording == "made-up" else path["events"]
    events = list(read_events(path))
    proc, url = start_watch(str(path))
    try:
        browser.get(url)
        wait_for(browser, f"window.swarmState.replay && window.swarmState.replay.loaded == {len(events)}")
        browser.execute_script(
            "document.getElementById('speed').value = '100';"
            " document.getElementById('speed').onchange({target: document.getElementById('speed')})"
        )
        wait_for(browser, "window.swarmState.replay.clock > 0")  # it plays by itself
        browser.find_element("id", "to-end").click()
        shown = wait_for(browser, f"window.swarmState.replay.applied == {len(events)} && window.swarmState")
    finally:
        stop(proc)
    summary = summarize(events)
    timeline = build_timeline(events)
    counts = shown["counts"]
    assert counts["preemptions"] == summary.preemptions == len(timeline.preemptions)
    assert counts["inheritances"] == summary.inheritances
    assert counts["finished"] == sum(isinstance(e, Finished) for e in events)
    assert counts["turns"] == sum(a.turns for a in summary.agents.values())
    assert len(shown["slots"]) == timeline.slots and not any(shown["slots"])
    assert shown["stopped"] and shown["step"] == summary.steps
    for name, a in summary.agents.items():
        row = shown["agents"][name]
        assert (row["turns"], row["tokens"], row["preemptions"]) == (a.turns, a.tokens, a.preempted), name
        assert row["paused_s"] == pytest.approx(a.paused_s)
    waits = percentiles(summary.fg_wait_s)
    if waits:
        assert shown["latency"]["fg_wait"]["p50"] == pytest.approx(waits["p50"])
        assert shown["latency"]["fg_wait"]["p99"] == pytest.approx(waits["p99"])
    if recording == "tiny-model":
        # Inter-token latency token by token, as the run's summary has it from its
        # agents' records (the log keeps token times to 0.1 ms).
        itl = summarize(events, request.getfixturevalue("demo_run")["agents"]).fg_itl_s
        assert shown["latency"]["itl"]["n"] == len(itl) > 1
        shown_itl = {k: shown["latency"]["itl"][k] for k in ("p50", "p90", "p99", "max")}
        assert shown_itl == pytest.approx(percentiles(itl), abs=1e-4)
