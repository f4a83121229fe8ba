"""`swarm watch` as a command (following a swarm's socket, and the next swarm),
`swarm serve` serving the page, a page reconnecting by itself, and
`swarm run --watch` saying where the page is; in a real headless chromium."""

from __future__ import annotations

import re

import anyio
import pytest
from browser import ROOT, start_watch, stop, wait_for
from test_watch import Foreground, on_page

from runtime.events.kinds import read_events
from runtime.scheduling.priority import FOREGROUND
from runtime.scheduling.timing import TimingEngine
from swarm import Swarm


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


@pytest.mark.asyncio
async def test_swarm_serve_serves_the_page_at_its_root(browser):
    from swarm.server import serve

    with anyio.fail_after(120):
        async with Swarm(TimingEngine(realtime=True), slots=2) as swarm, anyio.create_task_group() as tg:
            handle = await tg.start(
                lambda task_status: serve(swarm, model_id="timing", port=0, handle_signals=False, task_status=task_status)
            )
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
