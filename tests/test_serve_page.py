"""`swarm serve`'s doors: with --api-key, its live page in a real headless
chromium (a browser cannot send the key as a header, so `/?key=KEY` hands it a
cookie for the page and its event stream); and the Host header check, on each
kind of address it may listen on."""

from __future__ import annotations

import anyio
import pytest
from browser import wait_for
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient
from test_watch import Foreground, on_page

from runtime.scheduling.priority import FOREGROUND
from runtime.scheduling.timing import TimingEngine
from swarm import Swarm
from swarm.viewers.watch import trusted_hosts

KEY = "sekrit"


@pytest.mark.asyncio
async def test_the_guarded_page_opens_with_the_key_once_and_follows_the_swarm(browser):
    from swarm.server import serve

    with anyio.fail_after(120):
        async with Swarm(TimingEngine(realtime=True), slots=2) as swarm, anyio.create_task_group() as tg:
            handle = await tg.start(
                lambda task_status: serve(swarm, model_id="timing", port=0, api_key=KEY, handle_signals=False, task_status=task_status)
            )
            await on_page(browser.get, handle.url + "/")
            refused = await on_page(wait_for, browser, "document.body && document.body.innerText")
            assert "invalid API key" in refused and "swarmState" not in refused
            await on_page(browser.get, handle.url + f"/?key={KEY}")
            await on_page(wait_for, browser, "window.swarmState && window.swarmState.connected")
            assert await on_page(browser.execute_script, "return location.search") == ""  # the key leaves the address bar
            await swarm.spawn(Foreground("pair", FOREGROUND))
            shown = await on_page(wait_for, browser, "window.swarmState.counts.finished == 1 && window.swarmState")
            handle.shutdown()
    assert shown["agents"]["pair"]["tokens"] == 20


@pytest.mark.parametrize(
    ("listening", "host", "served"),
    [
        ("127.0.0.1", "127.0.0.1:8000", True),
        ("127.0.0.1", "localhost:8000", True),
        ("127.0.0.1", "evil.example:8000", False),
        ("::1", "[::1]:8000", True),
        ("::1", "evil.example", False),
        ("192.168.1.5", "192.168.1.5:8000", True),
        ("192.168.1.5", "evil.example:8000", False),
        ("0.0.0.0", "build-box.lan:8000", True),  # every address: any name (the key guards it)
    ],
)
def test_the_host_header_must_name_the_address_served(listening: str, host: str, served: bool) -> None:
    app = Starlette(routes=[Route("/", lambda request: PlainTextResponse("ok"))], middleware=[trusted_hosts(listening)])
    with TestClient(app) as client:
        assert (client.get("/", headers={"Host": host}).status_code == 200) == served
