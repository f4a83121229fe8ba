"""`swarm serve` under contention: one slot, a bounded queue, an API key; and
shutdown with and without a grace period. Real server processes throughout."""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from serve_helpers import SSE, EventWatcher, ServerProcess

from runtime.events.kinds import (
    Admitted,
    Cancelled,
    Ended,
    Event,
    Finished,
    Inherited,
    Preempted,
    Queued,
    Restored,
    Resumed,
    SwarmStarted,
    SwarmStopped,
)

MODEL = "tiny-serve"
KEY = "sekrit"
AUTH = {"Authorization": f"Bearer {KEY}"}
LONG = 3_000  # a background turn that outlasts any test step (4096-token context)
CHAT = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def server(serve_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    args = ("--slots", "1", "--max-queue", "1", "--api-key", KEY)
    with ServerProcess(serve_gguf, *args, tmp=tmp_path_factory.mktemp("server")) as server:
        yield server


@pytest.fixture
def client(server: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120) as client:
        yield client


def background_stream(server: ServerProcess, agent: str) -> SSE:
    """A raw background stream that holds the slot for thousands of tokens."""
    body = {"model": MODEL, "messages": CHAT, "max_tokens": LONG, "temperature": 0, "ignore_eos": True, "stream": True}
    stream = SSE(server, "/v1/chat/completions", body, {**AUTH, "X-Swarm-Agent": agent})
    assert stream.status == 200
    return stream


def ended(server: ServerProcess, agent: str) -> Ended:
    return server.wait_for_event(lambda e: isinstance(e, Ended) and e.agent == agent)


def test_a_foreground_request_preempts_a_background_stream(server: ServerProcess, client: openai.OpenAI) -> None:
    watcher = EventWatcher(server, headers=AUTH)
    try:
        stream = client.chat.completions.create(
            model=MODEL,
            messages=CHAT,
            max_tokens=LONG,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},  # usage in every chunk (vLLM's option)
            extra_body={"ignore_eos": True},
            extra_headers={"X-Swarm-Agent": "bg"},
        )
        chunks = iter(stream)
        first = next(c for c in chunks if c.choices and c.choices[0].delta.content)
        assert first.usage.preemptions == 0  # it holds the one slot now

        fg = client.chat.completions.create(
            model=MODEL,
            messages=CHAT,
            max_tokens=4,
            temperature=0,
            extra_body={"ignore_eos": True},
            extra_headers={"X-Swarm-Agent": "fg", "X-Swarm-Priority": "foreground"},
        )
        assert fg.usage.completion_tokens == 4 and fg.usage.preemptions == 0
        assert fg.usage.model_dump()["waited_s"] < 60  # it did not wait for the 3000-token turn

        # The background stream goes on where it was; its usage says it was paused.
        resumed = next(c for _, c in zip(range(LONG), chunks, strict=False) if c.usage and c.usage.model_dump()["preemptions"])
        usage = resumed.usage.model_dump()
        assert usage["preemptions"] == 1 and usage["paused_s"] > 0
        stream.close()
        assert ended(server, "bg").reason == "client disconnected"
    finally:
        watcher.close()
    seen = watcher.events
    assert isinstance(seen[0], SwarmStarted)
    preempted = [e for e in seen if isinstance(e, Preempted)]
    assert [(e.agent, e.by_agent, e.by_priority) for e in preempted] == [("bg", "fg", 10)]
    fg_admitted = next(e for e in seen if isinstance(e, Admitted) and e.agent == "fg")
    assert fg_admitted.step == preempted[0].step and fg_admitted.slot == 0
    assert any(isinstance(e, Resumed) and e.agent == "bg" for e in seen)


def test_past_max_queue_background_gets_429_and_foreground_still_gets_in(server: ServerProcess) -> None:
    first = background_stream(server, "hog1")
    next(c for c in first.chunks() if c["choices"][0]["delta"].get("content"))  # decoding: it holds the one slot
    second = background_stream(server, "hog2")  # waits: the queue (1) is now full
    server.wait_for_event(lambda e: isinstance(e, Queued) and e.agent == "hog2")
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 2, "temperature": 0}
    status, headers, data = server.request("POST", "/v1/chat/completions", body, {**AUTH, "X-Swarm-Agent": "hog3"})
    assert status == 429 and int(headers["retry-after"]) >= 1
    assert json.loads(data)["error"]["type"] == "rate_limit_error"
    status, _, data = server.request(
        "POST", "/v1/chat/completions", body, {**AUTH, "X-Swarm-Agent": "boss", "X-Swarm-Priority": "foreground"}
    )
    assert status == 200 and json.loads(data)["usage"]["completion_tokens"] >= 1
    first.hang_up()
    second.hang_up()
    assert isinstance(ended(server, "hog1"), Cancelled) and isinstance(ended(server, "hog2"), Cancelled)


def test_a_caller_waiting_on_another_outside_agent_lends_it_its_priority(server: ServerProcess) -> None:
    worker = background_stream(server, "worker")
    next(c for c in worker.chunks() if c["choices"][0]["delta"].get("content"))  # it holds the one slot
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 2, "temperature": 0}
    headers = {**AUTH, "X-Swarm-Agent": "chief", "X-Swarm-Priority": "foreground", "X-Swarm-Waits-On": "worker"}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        chief = pool.submit(server.request, "POST", "/v1/chat/completions", body, headers)
        lent = server.wait_for_event(lambda e: isinstance(e, Inherited) and e.agent == "worker")
        assert (lent.priority, lent.by_agent) == (10, "chief")
        # The worker now runs at the chief's priority: the chief, who waits on it, does not take its slot.
        server.wait_for_event(lambda e: isinstance(e, Queued) and e.agent == "chief")
        worker.hang_up()
        status, _, data = chief.result(timeout=120)
    assert status == 200 and json.loads(data)["usage"]["completion_tokens"] == 2
    assert not [e for e in server.events() if isinstance(e, Preempted) and e.agent == "worker"]
    restored = server.wait_for_event(lambda e: isinstance(e, Restored) and e.agent == "worker")
    assert restored.priority == 0


def test_the_api_key_guards_every_path_but_health(server: ServerProcess) -> None:
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        status, _, data = server.request("POST", "/v1/chat/completions", body, headers)
        assert status == 401 and json.loads(data)["error"]["code"] == "invalid_api_key"
    for path in ("/v1/models", "/v1/events", "/watch/events", "/metrics", "/", "/v1/nothing"):
        status, _, data = server.request("GET", path)
        assert status == 401 and json.loads(data)["error"]["code"] == "invalid_api_key", path
    for path in ("/v1/models", "/metrics", "/"):
        assert server.request("GET", path, headers=AUTH)[0] == 200, path
    page_events = SSE(server, "/watch/events", method="GET", headers=AUTH)
    assert page_events.status == 200
    page_events.hang_up()
    assert server.request("GET", "/health")[0] == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()


def test_a_browser_opens_the_guarded_page_with_the_key_once(server: ServerProcess) -> None:
    # /?key=KEY sets a cookie and leads on to /, whose page and event stream then
    # need nothing more; the cookie is not the key, and it opens no /v1 path.
    assert server.request("GET", "/?key=wrong")[0] == 401
    status, headers, _ = server.request("GET", f"/?key={KEY}")
    assert status == 303 and headers["location"] == "/"
    cookie = headers["set-cookie"].split(";")[0]
    assert KEY not in cookie and "httponly" in headers["set-cookie"].lower() and "samesite=strict" in headers["set-cookie"].lower()
    status, _, page = server.request("GET", "/", headers={"Cookie": cookie})
    assert status == 200 and b"<html" in page.lower()
    events = SSE(server, "/watch/events", method="GET", headers={"Cookie": cookie})
    assert events.status == 200
    events.hang_up()
    assert server.request("GET", "/v1/models", headers={"Cookie": cookie})[0] == 401
    assert server.request("GET", "/", headers={"Cookie": "swarm_page=forged"})[0] == 401


# ------------------------------------------------------------------- shutdown


def one_terminal_each(events: list[Event]) -> dict[int, Ended]:
    queued = [e.turn for e in events if isinstance(e, Queued)]
    terminal = [e for e in events if isinstance(e, Ended)]
    assert sorted(e.turn for e in terminal) == sorted(queued)  # exactly one each
    assert isinstance(events[-1], SwarmStopped)
    return {e.turn: e for e in terminal}


def test_shutdown_lets_running_turns_finish_within_the_grace(serve_gguf: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    with ServerProcess(serve_gguf, "--slots", "2", "--grace", "120", "--log-prompts", str(prompts), tmp=tmp_path) as server:
        body = {"model": MODEL, "messages": CHAT, "max_tokens": 300, "temperature": 0, "ignore_eos": True, "stream": True}
        stream = SSE(server, "/v1/chat/completions", body, {"X-Swarm-Agent": "finisher"})
        chunks = stream.chunks()
        next(chunks)
        server.proc.send_signal(15)
        rest = list(chunks)  # up to [DONE]
        stream.hang_up()
        assert rest[-1]["choices"][0]["finish_reason"] == "length"
        assert server.proc.wait(60) == 0
    ends = one_terminal_each(server.events())
    assert [type(e) for e in ends.values()] == [Finished]
    [logged] = [json.loads(line) for line in prompts.read_text().splitlines()]  # asked for: the prompt log has it
    assert logged["agent"] == "finisher" and logged["prompt"] == CHAT and logged["finish_reason"] == "length"
    assert logged["completion"] == "".join(c["choices"][0]["delta"].get("content", "") for c in rest)


def test_shutdown_past_the_grace_cancels_the_rest_each_once(serve_gguf: Path, tmp_path: Path) -> None:
    with ServerProcess(serve_gguf, "--slots", "1", "--grace", "0", tmp=tmp_path) as server:
        running = background_stream_open(server, "runner")
        next(c for c in running.chunks() if c["choices"][0]["delta"].get("content"))
        queued = background_stream_open(server, "queued")
        server.wait_for_event(lambda e: isinstance(e, Queued) and e.agent == "queued")
        watcher = EventWatcher(server)
        server.proc.send_signal(15)
        for stream in (running, queued):
            payloads = list(stream)
            assert payloads[-1] == "[DONE]"
            error = json.loads(payloads[-2])["error"]
            assert error["code"] == "cancelled" and "server shutting down" in error["message"]
            stream.hang_up()
        assert server.proc.wait(60) == 0
        watcher.close()
    # A viewer watching the events sees the cancellations before its stream ends.
    assert {(e.agent, e.reason) for e in watcher.events if isinstance(e, Cancelled)} == {
        ("queued", "server shutting down"),
        ("runner", "server shutting down"),
    }
    ends = one_terminal_each(server.events())
    assert sorted((e.agent, type(e), e.reason) for e in ends.values()) == [
        ("queued", Cancelled, "server shutting down"),
        ("runner", Cancelled, "server shutting down"),
    ]


def background_stream_open(server: ServerProcess, agent: str) -> SSE:
    body = {"model": MODEL, "messages": CHAT, "max_tokens": LONG, "temperature": 0, "ignore_eos": True, "stream": True}
    stream = SSE(server, "/v1/chat/completions", body, {"X-Swarm-Agent": agent})
    assert stream.status == 200
    return stream
