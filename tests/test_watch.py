"""`swarm watch`: the hub's stream, and the page in a real headless chromium.

The browser is waited on by polling `window.swarmState` with generous bounds,
never by sleeping: what is asserted is what the page holds, not how fast it
got there. (The one bound on time is the issue's own: a pause mark is on the
page within one second of its event, measured by the page itself.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import anyio
import msgspec
import pytest

from browser import chromium, close, state, wait_for
from runtime.bus import EventBus
from runtime.events import Admitted, Dropped, Finished, Queued, SwarmStarted, decode, kind_named, read_events
from runtime.priority import BACKGROUND, FOREGROUND
from runtime.stream import encode_line
from runtime.timing import TimingEngine
from swarm import Agent, Swarm, handler
from swarm.plot import build_timeline
from swarm.runner import SessionRunner
from swarm.session import DEMO_SESSION, load_session
from runtime.units import percentiles
from swarm.summary import summarize
from swarm.watch import WatchHub, bind_loopback, create_app, follow_bus, serve_http

ROOT = Path(__file__).parent.parent
LONG = 1_000_000  # a background turn that never ends within a test


# ---------------------------------------------------------------- the hub alone


def parse_sse(chunks: list[bytes]) -> list[dict]:
    """Server-sent event frames as dicts: {"event", "id", "data"}, with the data
    lines joined by newlines, as a browser does."""
    frames = []
    for block in b"".join(chunks).decode().split("\n\n"):
        fields: dict = {"event": "message"}
        for line in block.splitlines():
            if line.startswith(":") or not line:
                continue
            key, _, value = line.partition(": ")
            fields[key] = fields[key] + "\n" + value if key == "data" and "data" in fields else value
        if "data" in fields:
            frames.append(fields)
    return frames


def lines_in(frames: list[dict]) -> list[dict]:
    """The stream's JSON lines in the frames: each message a batch, a line an event."""
    return [json.loads(line) for f in frames if f["event"] == "message" for line in f["data"].split("\n")]


def events_in(frames: list[dict]) -> list:
    """The stream's events in the frames, as their classes."""
    return [decode(json.dumps(line)) for line in lines_in(frames)]


async def read_stream(hub: WatchHub, last_id: str | None = None) -> list[dict]:
    """Everything a page would get now, stopping once it waits for more."""
    chunks = []
    stream = hub.stream(last_id)
    with anyio.move_on_after(0.2):  # the stream only ever waits for news here
        async for chunk in stream:
            chunks.append(chunk)
    await stream.aclose()
    return parse_sse(chunks)


def line(name: str, **fields) -> bytes:
    return encode_line(kind_named(name)(t=fields.pop("t", 0.0), step=fields.pop("step", 0), **fields))


@pytest.mark.anyio
async def test_a_page_gets_the_whole_session_and_resumes_exactly_where_it_was():
    hub = WatchHub()
    hub.publish(line("swarm.started", unix_time=1.0, slots=2))
    hub.publish(line("turn.queued", turn=1, agent="a", priority=0, tokens=3))
    first = await read_stream(hub)
    assert [f["event"] for f in first[:2]] == ["hello", "reset"]
    assert [type(e) for e in events_in(first)] == [SwarmStarted, Queued]
    hub.publish(line("turn.admitted", turn=1, agent="a", priority=0, slot=0))
    again = await read_stream(hub, first[-1]["id"])
    assert "reset" not in [f["event"] for f in again]
    assert [type(e) for e in events_in(again)] == [Admitted]
    # An id from another hub (a restarted server) starts over.
    other = await read_stream(WatchHub(), first[-1]["id"])
    assert [f["event"] for f in other[:2]] == ["hello", "reset"]


@pytest.mark.anyio
async def test_a_page_behind_the_bounded_history_is_told_how_many_events_it_lost():
    hub = WatchHub(max_history=10)
    hub.publish(line("swarm.started", unix_time=1.0, slots=2))
    seen = await read_stream(hub)
    for i in range(25):
        hub.publish(line("turn.queued", turn=i, agent="a", priority=0, tokens=3))
    later = events_in(await read_stream(hub, seen[-1]["id"]))
    # 26 events in all; the page had read the first; the history keeps the last few.
    assert hub.base + len(hub.history) == 26 and hub.base > 1
    assert later[0] == Dropped(hub.base - 1)
    assert len(later) == 1 + len(hub.history)


@pytest.mark.anyio
async def test_a_new_swarm_starts_pages_over_and_the_same_swarm_again_is_a_gap():
    hub = WatchHub()
    hub.publish(line("swarm.started", unix_time=1.0, slots=2))
    seen = await read_stream(hub)
    hub.publish(line("swarm.started", unix_time=1.0, slots=2))  # the socket reconnected
    gap = await read_stream(hub, seen[-1]["id"])
    assert lines_in(gap) == [{"event": "events.dropped", "count": None}]
    hub.publish(line("swarm.started", unix_time=2.0, slots=4))  # the next swarm
    new = await read_stream(hub, gap[-1]["id"])
    assert "reset" in [f["event"] for f in new]
    assert [e.slots for e in events_in(new)] == [4]


@pytest.mark.asyncio
async def test_fifty_pages_cost_the_bus_one_subscriber_share_each_batch_and_a_stalled_one_holds_no_one_up():
    bus, hub = EventBus(), WatchHub()
    n, events = 50, 3000  # enough that the stalled page's socket buffers fill up
    received, messages = [0] * n, [0] * n

    async def page(i: int, port: int) -> None:
        async with await anyio.connect_tcp("127.0.0.1", port) as conn:
            # HTTP/1.0: the body comes whole, not in chunks, so frames can be counted in it.
            await conn.send(b"GET /watch/events HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            if i == 0:
                await anyio.sleep_forever()  # opens the stream, never reads it
            rest = b""
            while received[i] < events:
                whole, _, rest = (rest + await conn.receive()).rpartition(b"\n\n")
                received[i] += whole.count(b'data: {"event":"turn.queued"')
                messages[i] += whole.count(b"\nid: ")

    with anyio.fail_after(120):
        async with page_server(hub) as url, anyio.create_task_group() as tg:
            port = int(url.rsplit(":", 1)[1].strip("/"))
            await tg.start(follow_bus, hub, bus)
            pages = anyio.CancelScope()
            tg.start_soon(_run_pages, pages, [partial(page, i, port) for i in range(n)])
            while hub.readers < n:
                await anyio.sleep(0.01)
            assert len(bus._subscribers) == 1  # the pages are the hub's, not the bus's
            for i in range(events):
                bus.emit(kind_named("turn.queued")(t=i * 0.001, step=i, turn=i, agent="a", priority=0, tokens=3))
                if i % 100 == 0:
                    await anyio.sleep(0)
            while min(received[1:]) < events:
                await anyio.sleep(0.01)
            pages.cancel()
            bus.close()
    assert received[0] == 0 and set(received[1:]) == {events}
    # Events go out in batches, not one message each, and pages that keep up
    # share each batch: it is framed once for all of them.
    assert max(messages) < events / 100 and hub.batches_built * 10 <= sum(messages)


async def _run_pages(scope: anyio.CancelScope, pages) -> None:
    with scope:
        async with anyio.create_task_group() as tg:
            for p in pages:
                tg.start_soon(p)


# ------------------------------------------------------------------ the browser


@pytest.fixture(scope="module")
def browser():
    driver = chromium()
    yield driver
    close(driver)


async def on_page(fn, *args, **kwargs):
    """Run a blocking browser call in a worker thread: the swarm and the page
    server keep running on this event loop meanwhile."""
    return await anyio.to_thread.run_sync(partial(fn, *args, **kwargs))


@asynccontextmanager
async def page_server(hub: WatchHub):
    sock = bind_loopback(0)
    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(serve_http, create_app(hub), sock, on_stop=[hub.close]))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/"
        tg.cancel_scope.cancel()


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
                seen["lanes"] = await on_page(
                    wait_for, browser, "window.swarmState.slots.filter(s => s).length >= 2 && window.swarmState"
                )
                seen["drawn"] = await on_page(wait_for, browser, "window.swarmState.drawn_lanes == 8 && document.getElementById('lanes').clientHeight")
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


def start_watch(*args: str, port: str = "0") -> tuple[subprocess.Popen, str]:
    """`swarm watch ARGS --port PORT` as its own process; returns it and its page's URL."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "swarm.cli", "watch", *args, "--port", port],
        stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )
    first = proc.stderr.readline()
    found = re.search(r"http://127\.0\.0\.1:\d+/", first)
    if not found:
        proc.kill()
        raise AssertionError(f"swarm watch did not start: {first}{proc.stderr.read()}")
    return proc, found.group(0)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=30)
    proc.stderr.close()


@pytest.mark.asyncio
async def test_swarm_watch_waits_for_a_swarm_follows_it_and_the_next_one(browser, tmp_path):
    sock = tmp_path / "swarm.sock"
    proc, url = start_watch(str(sock))
    try:
        with anyio.fail_after(180):
            await on_page(browser.get, url)
            await on_page(wait_for, browser, "window.swarmState.connected && /waiting/.test(window.swarmState.status.text)")
            turns = []
            for round_ in range(2):
                async with Swarm(TimingEngine(realtime=True), slots=2 + round_, socket=sock) as swarm:
                    await on_page(wait_for, browser, f"window.swarmState.started && window.swarmState.started.slots == {2 + round_}")
                    await swarm.spawn(Foreground("pair", FOREGROUND))
                    await swarm.join("pair")
                got = await on_page(wait_for, browser, "window.swarmState.stopped && window.swarmState")
                turns.append((got["counts"]["turns"], got["counts"]["finished"], len(got["slots"])))
            # A page opened after the swarm ended still sees that swarm, whole.
            await on_page(browser.get, url)
            late = await on_page(wait_for, browser, "window.swarmState.stopped && window.swarmState")
    finally:
        stop(proc)
    assert turns == [(1, 1, 2), (1, 1, 3)]
    assert late["counts"]["finished"] == 1 and len(late["slots"]) == 3


@pytest.mark.parametrize("recording", ["made-up", "tiny-model"])
def test_replaying_a_recording_reaches_the_counts_of_swarm_plot_and_the_run_summary(browser, recording, request):
    path = request.getfixturevalue("events_file" if recording == "made-up" else "demo_run")
    path = path if recording == "made-up" else path["events"]
    events = list(read_events(path))
    proc, url = start_watch(str(path))
    try:
        browser.get(url)
        wait_for(browser, f"window.swarmState.replay && window.swarmState.replay.loaded == {len(events)}")
        browser.execute_script("document.getElementById('speed').value = '100'; document.getElementById('speed').onchange({target: document.getElementById('speed')})")
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


@pytest.mark.asyncio
async def test_swarm_serve_serves_the_page_at_its_root(browser):
    from swarm.server import serve

    with anyio.fail_after(120):
        async with Swarm(TimingEngine(realtime=True), slots=2) as swarm, anyio.create_task_group() as tg:
            handle = await tg.start(lambda task_status: serve(swarm, model_id="timing", port=0, handle_signals=False, task_status=task_status))
            await on_page(browser.get, handle.url + "/")
            await swarm.spawn(Foreground("pair", FOREGROUND))
            shown = await on_page(wait_for, browser, "window.swarmState.counts.finished == 1 && window.swarmState")
            handle.shutdown()  # the open page does not hold the shutdown up
    assert shown["started"]["slots"] == 2 and shown["agents"]["pair"]["tokens"] == 20


def test_a_page_reconnects_by_itself_when_its_server_comes_back(browser, events_file):
    proc, url = start_watch(str(events_file))
    port = url.rsplit(":", 1)[1].strip("/")
    try:
        browser.get(url)
        wait_for(browser, "window.swarmState.connected && window.swarmState.replay.loaded > 0")
        stop(proc)
        wait_for(browser, "!window.swarmState.connected")
        proc, _ = start_watch(str(events_file), port=port)
        shown = wait_for(browser, "window.swarmState.connected && window.swarmState.replay.loaded > 0 && window.swarmState")
    finally:
        stop(proc)
    assert shown["replay"]["loaded"] == sum(1 for _ in read_events(events_file))  # once, not twice


def test_swarm_run_watch_prints_where_the_page_is(tmp_path, tiny_gguf, capsys):
    from swarm.cli import main

    session = tmp_path / "session.toml"
    session.write_text(
        f'model = "{tiny_gguf}"\nslots = 2\nstep_tokens = 16\nworkspace = "{ROOT / "agents" / "sample_project"}"\n'
        f'out = "{tmp_path / "out"}"\nduration = 60\ninterval = 0.1\nscript = ["hello"]\n'
        '[[agents]]\nclass = "pair"\npriority = "foreground"\noptions = { max_tokens = 4 }\n'
    )
    assert main(["run", str(session), "--watch", "--port", "0", "--quiet"]) == 0
    assert re.search(r"page: +http://127\.0\.0\.1:\d+/", capsys.readouterr().out)
    assert main(["run", str(session), "--watch", "--port", "70000"]) == 2
    assert "--port must be between 0 and 65535" in capsys.readouterr().err
