"""`swarm serve` as its users meet it: a real server process, the official `openai`
client, and raw HTTP for what that client never sends.

The tiny random model writes bytes, not prose: tests compare texts with each other
(greedy is deterministic), never with words."""

from __future__ import annotations

import concurrent.futures
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from serve_helpers import SSE, ServerProcess

from runtime.events.kinds import Cancelled, Ended, Finished, Queued

MODEL = "tiny-serve"
FG = {"X-Swarm-Priority": "foreground"}
LONG = 3_000  # a background turn that outlasts any test step (4096-token context)


@pytest.fixture(scope="module")
def server(serve_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with ServerProcess(serve_gguf, "--slots", "2", tmp=tmp_path_factory.mktemp("server")) as server:
        yield server


@pytest.fixture
def client(server: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120) as client:
        yield client


def chat(content: str = "hello") -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


# ------------------------------------------------------------- the openai client


def test_a_chat_completion_has_text_and_slotswarm_usage(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=chat(), max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    assert reply.object == "chat.completion" and reply.model == MODEL
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content and choice.finish_reason == "length"
    usage = reply.usage.model_dump()
    assert usage["completion_tokens"] == 8 and usage["prompt_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + 8
    assert usage["waited_s"] >= 0 and usage["ttft_s"] >= usage["waited_s"]
    assert usage["paused_s"] == 0 and usage["preemptions"] == 0
    again = client.chat.completions.create(model=MODEL, messages=chat(), max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    assert again.choices[0].message.content == choice.message.content  # greedy is deterministic


def test_a_streamed_chat_says_what_the_whole_one_says(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = dict(model=MODEL, messages=chat("stream me"), max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**kw).choices[0].message.content
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    finishing = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishing == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert len({c.id for c in chunks}) == 1


def test_text_completions_stream_and_not(client: openai.OpenAI) -> None:
    whole = client.completions.create(model=MODEL, prompt="def f(x):", max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    assert whole.object == "text_completion" and whole.usage.completion_tokens == 6
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=MODEL, prompt="def f(x):", max_tokens=6, temperature=0, stream=True, extra_body={"ignore_eos": True}
        )
    )
    assert streamed == whole.choices[0].text
    ids = client.completions.create(model=MODEL, prompt=[40, 41, 42], max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    assert ids.usage.prompt_tokens == 3 and ids.usage.completion_tokens == 3


def test_seeded_sampling_repeats_and_stop_strings_cut_the_text(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = dict(
        model=MODEL, messages=chat("sample"), max_tokens=20, temperature=1.0, top_p=0.9, seed=7, extra_body={"ignore_eos": True}
    )
    a = client.chat.completions.create(**kw).choices[0].message.content
    assert client.chat.completions.create(**kw).choices[0].message.content == a
    stop = a[3:5]  # a stop string taken from the middle of the text: the text ends before it
    cut = client.chat.completions.create(**kw, stop=[stop])
    assert cut.choices[0].finish_reason == "stop" and stop not in cut.choices[0].message.content
    assert a.startswith(cut.choices[0].message.content)
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**kw, stop=stop, stream=True) if c.choices)
    assert streamed == cut.choices[0].message.content


def test_concurrent_callers_each_get_their_own_answer(client: openai.OpenAI, server: ServerProcess) -> None:
    prompts = [f"caller {i}" for i in range(6)]
    alone = {
        p: client.chat.completions.create(model=MODEL, messages=chat(p), max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
        .choices[0]
        .message.content
        for p in prompts
    }

    def call(p: str) -> tuple[str, str]:
        stream = client.chat.completions.create(
            model=MODEL,
            messages=chat(p),
            max_tokens=10,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
            extra_headers={"X-Swarm-Agent": f"agent-{p[-1]}"},
        )
        return p, "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        together = dict(pool.map(call, prompts))
    assert together == alone  # batched with others (2 slots, 6 callers), each turn decodes as if alone
    agents = {e.agent for e in server.events() if isinstance(e, Finished)}
    assert {f"agent-{i}" for i in range(6)} <= agents


def test_callers_are_named_by_header_else_user_else_connection(server: ServerProcess) -> None:
    body = {**GOOD, "messages": [{"role": "user", "content": "a secret prompt 6f2d"}]}
    assert server.request("POST", "/v1/chat/completions", {**body, "user": "alice"})[0] == 200
    assert server.request("POST", "/v1/chat/completions", {**body, "user": "alice"}, {"X-Swarm-Agent": "bob"})[0] == 200
    conn = server.connect()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
    assert conn.getresponse().read()
    port = conn.sock.getsockname()[1]
    conn.close()
    agents = [e.agent for e in server.events() if isinstance(e, Queued)][-3:]
    assert agents == ["alice", "bob", f"conn-127.0.0.1:{port}"]
    # Prompts are not logged unless asked (--log-prompts).
    assert "6f2d" not in server.events_path.read_text() and "6f2d" not in server.stderr()


def test_models_and_health(client: openai.OpenAI, server: ServerProcess) -> None:
    assert server.host == "127.0.0.1"  # loopback unless --host says otherwise
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-4")
    assert missing.value.code == "model_not_found"
    status, _, body = server.request("GET", "/health")
    assert status == 200 and json.loads(body)["status"] == "ok"


# --------------------------------------------------------------------- raw HTTP


def error_of(status: int, body: bytes) -> dict[str, Any]:
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


GOOD = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.mark.parametrize(
    ("body", "headers", "status", "code", "param"),
    [
        (b"{not json", {}, 400, "invalid_json", None),
        (b"[1, 2]", {}, 400, None, None),
        ({**GOOD, "tools": []}, {}, 400, None, "tools"),
        ({**GOOD, "frobnicate": 1}, {}, 400, "unsupported_parameter", "frobnicate"),
        ({**GOOD, "n": 2}, {}, 400, "unsupported_parameter", "n"),
        ({**GOOD, "logprobs": True}, {}, 400, "unsupported_parameter", "logprobs"),
        ({**GOOD, "temperature": 3}, {}, 400, None, "temperature"),
        ({**GOOD, "top_p": 0}, {}, 400, None, "top_p"),
        ({**GOOD, "max_tokens": 0}, {}, 400, None, "max_tokens"),
        ({**GOOD, "max_tokens": "2"}, {}, 400, None, "max_tokens"),
        ({**GOOD, "stop": ["a", "b", "c", "d", "e"]}, {}, 400, None, "stop"),
        ({**GOOD, "messages": []}, {}, 400, None, "messages"),
        ({**GOOD, "messages": [{"role": "robot", "content": "x"}]}, {}, 400, None, "messages[0].role"),
        (
            {**GOOD, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            {},
            400,
            None,
            "messages[0].content",
        ),
        ({**GOOD, "priority": "high"}, {}, 400, None, "priority"),
        ({**GOOD, "priority": 10**9}, {}, 400, "invalid_priority", "priority"),
        (GOOD, {"X-Swarm-Priority": "urgent"}, 400, "invalid_priority", "X-Swarm-Priority"),
        ({**GOOD, "priority": 0}, {"X-Swarm-Priority": "foreground"}, 400, "invalid_priority", "priority"),
        (GOOD, {"X-Swarm-Agent": "bad name!"}, 400, "invalid_agent", "X-Swarm-Agent"),
        (GOOD, {"X-Swarm-Agent": "gpu"}, 400, "invalid_agent", "X-Swarm-Agent"),
        (GOOD, {"X-Swarm-Agent": "me", "X-Swarm-Waits-On": "me"}, 400, "wait_cycle", "X-Swarm-Waits-On"),
        ({**GOOD, "max_tokens": 5000}, {}, 400, "context_length_exceeded", "messages"),
        ({**GOOD, "messages": [{"role": "user", "content": "x " * 5000}]}, {}, 400, "context_length_exceeded", "messages"),
        ({**GOOD, "model": "gpt-4"}, {}, 404, "model_not_found", "model"),
        ({**GOOD, "stream_options": {"include_usage": True}}, {}, 400, None, "stream_options"),
        pytest.param(
            b'{"model": "tiny-serve", "messages": [{"role": "user", "content": ' + b"[" * 1000 + b"]" * 1000 + b"}]}",
            {},
            400,
            "invalid_json",
            None,
            id="content-nested-1000-deep",
        ),
        pytest.param(
            b'{"model": "tiny-serve", "messages": [{"role": "user", "content": [' + b'{"a": ' * 5000 + b"1" + b"}" * 5000 + b"]}]}",
            {},
            400,
            "invalid_json",
            None,
            id="content-part-nested-5000-deep",
        ),
    ],
)
def test_bad_chat_requests_get_an_openai_error_object(
    server: ServerProcess, body: Any, headers: dict[str, str], status: int, code: str | None, param: str | None
) -> None:
    got, _, data = server.request("POST", "/v1/chat/completions", body, headers)
    assert got == status, data
    error = error_of(got, data)
    assert error["type"] == "invalid_request_error"
    assert (error["code"], error["param"]) == (code, param) if code else error["param"] == param


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL, "prompt": [[1], [2]]}, "prompt"),
        ({"model": MODEL, "prompt": [10**6]}, "prompt"),
        ({"model": MODEL, "prompt": "x", "echo": True}, "echo"),
        ({"model": MODEL, "prompt": ""}, "prompt"),
        ({"model": MODEL}, None),
    ],
)
def test_bad_text_completions_are_400(server: ServerProcess, body: Any, param: str | None) -> None:
    status, _, data = server.request("POST", "/v1/completions", body)
    assert status == 400 and error_of(status, data)["param"] == param


def test_a_deeply_nested_prompt_is_a_400_too(server: ServerProcess) -> None:
    body = b'{"model": "tiny-serve", "prompt": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    status, _, data = server.request("POST", "/v1/completions", body)
    assert status == 400 and error_of(status, data)["code"] == "invalid_json"


SCALAR = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
JSON = SCALAR | st.lists(SCALAR, max_size=3) | st.dictionaries(st.text(max_size=6), SCALAR, max_size=3)
FIELDS = (
    "messages",
    "prompt",
    "stream",
    "stream_options",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "n",
    "user",
    "priority",
    "ignore_eos",
    "logprobs",
    "frequency_penalty",
    "tools",
    "max_completion_tokens",
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]),
    body=st.fixed_dictionaries(
        {"model": st.sampled_from([MODEL, "other"]), "max_tokens": st.integers(-2, 3) | JSON},  # at most 3 tokens if accepted
        optional={name: JSON | st.just([{"role": "user", "content": "hi"}]) | st.just("hi") for name in FIELDS},
    ),
    headers=st.dictionaries(
        st.sampled_from(["X-Swarm-Priority", "X-Swarm-Agent", "X-Swarm-Waits-On"]),
        st.sampled_from(["foreground", "background", "7", "-1", "x y", "", "helper"]),
        max_size=2,
    ),
)
def test_no_request_body_gets_a_500(server: ServerProcess, path: str, body: dict[str, Any], headers: dict[str, str]) -> None:
    status, _, data = server.request("POST", path, body, headers)
    assert status in (200, 400, 404), data
    if status != 200:
        error_of(status, data)


def test_unknown_routes_and_methods_are_error_objects_too(server: ServerProcess) -> None:
    status, _, data = server.request("GET", "/v1/nothing")
    assert status == 404 and error_of(status, data)["code"] == "not_found"
    # What other servers serve gets a 404 saying what this one does.
    for path in ("/v1/embeddings", "/api/chat"):
        status, _, data = server.request("POST", path, {"model": MODEL, "input": "x", "messages": []})
        message = error_of(status, data)["message"]
        assert status == 404 and "POST /v1/chat/completions" in message and "GET /v1/models" in message, message
    status, _, data = server.request("GET", "/v1/chat/completions")
    assert status == 405 and error_of(status, data)["code"] == "method_not_allowed"
    status, _, data = server.request("POST", "/v1/chat/completions", b"x" * (5 * 1024 * 1024))
    assert status == 413 and error_of(status, data)["code"] == "body_too_large"


def test_a_client_that_hangs_up_mid_stream_cancels_its_turn(server: ServerProcess) -> None:
    body = {**GOOD, "max_tokens": LONG, "ignore_eos": True, "stream": True}
    stream = SSE(server, "/v1/chat/completions", body, {"X-Swarm-Agent": "quitter"})
    assert stream.status == 200
    for _ in zip(range(3), stream.chunks(), strict=False):
        pass
    stream.hang_up()
    ended = server.wait_for_event(lambda e: isinstance(e, Ended) and e.agent == "quitter")
    assert isinstance(ended, Cancelled) and ended.reason == "client disconnected"
    assert ended.tokens < LONG
    # Nothing else runs on this server now: every KV block is back.
    for _ in range(200):
        if scrape(server)["slotswarm_kv_blocks_used"] == 0:
            break
        time.sleep(0.05)
    assert scrape(server)["slotswarm_kv_blocks_used"] == 0


def scrape(server: ServerProcess) -> dict[str, float]:
    status, headers, body = server.request("GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            key = sample.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items())) + "}" if sample.labels else "")
            samples[key] = sample.value
    return samples


def test_metrics_parse_and_add_up(server: ServerProcess, client: openai.OpenAI) -> None:
    assert server.request("POST", "/v1/chat/completions", b"{")[0] == 400
    client.chat.completions.create(
        model=MODEL, messages=chat(), max_tokens=4, temperature=0, extra_body={"ignore_eos": True}, extra_headers=FG
    )
    m = scrape(server)
    assert m["slotswarm_slots"] == 2
    assert m["slotswarm_running_turns"] == m["slotswarm_slots_in_use"] <= 2
    assert m["slotswarm_kv_blocks_used"] + m["slotswarm_kv_blocks_free"] > 0
    assert 0 <= m["slotswarm_kv_blocks_cached"] <= m["slotswarm_kv_blocks_free"]
    assert m["slotswarm_turns_total{outcome=finished}"] >= 1
    assert m["slotswarm_http_completion_tokens_total{class=foreground}"] >= 4
    assert m["slotswarm_time_to_first_token_seconds_count{class=foreground}"] >= 1
    assert m["slotswarm_inter_token_latency_seconds_count{class=foreground}"] >= 3
    assert m["slotswarm_wait_seconds_count{class=foreground}"] >= 1
    assert m["slotswarm_http_responses_total{path=/v1/chat/completions,status=200}"] >= 1
    assert m["slotswarm_http_responses_total{path=/v1/chat/completions,status=400}"] >= 1
    for name in ("slotswarm_preemptions_total", "slotswarm_priority_inheritances_total", "slotswarm_waiting_turns"):
        assert name in m


def test_a_repeated_prompt_says_how_much_of_it_the_prefix_cache_served(client: openai.OpenAI) -> None:
    messages = chat("a prompt long enough to fill several KV blocks " * 8)
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, temperature=0)
    again = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, temperature=0)
    cached = [reply.usage.prompt_tokens_details.cached_tokens for reply in (first, again)]
    assert cached[1] > cached[0] and cached[1] <= again.usage.prompt_tokens
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=2, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    usage = [chunk.usage for chunk in stream if chunk.usage][-1]
    assert usage.prompt_tokens_details.cached_tokens == cached[1]


def test_the_body_priority_runs_lower_first_as_in_vllm(server: ServerProcess) -> None:
    for agent, priority, headers in (("vllm-urgent", -10, {}), ("vllm-later", 5, {}), ("vllm-default", None, {}), ("both", -10, FG)):
        body = {**GOOD, **({} if priority is None else {"priority": priority})}
        status, _, data = server.request("POST", "/v1/chat/completions", body, {"X-Swarm-Agent": agent, **headers})
        assert status == 200, data
    queued = {e.agent: e.priority for e in server.events() if isinstance(e, Queued)}
    assert (queued["vllm-urgent"], queued["vllm-later"], queued["vllm-default"], queued["both"]) == (10, -5, 0, 10)


def test_a_json_body_must_say_it_is_json(server: ServerProcess) -> None:
    # A web page may POST text/plain anywhere without a preflight: never taken as JSON.
    for content_type in ("text/plain", "application/x-www-form-urlencoded", ""):
        status, _, data = server.request("POST", "/v1/chat/completions", json.dumps(GOOD).encode(), {"content-type": content_type})
        assert status == 415 and error_of(status, data)["code"] == "unsupported_media_type"
    assert server.request("POST", "/v1/chat/completions", GOOD, {"content-type": "application/json; charset=utf-8"})[0] == 200


def test_a_host_header_naming_another_site_is_refused(server: ServerProcess) -> None:
    # A DNS-rebinding page reaches a loopback server under its own name.
    for path in ("/v1/models", "/", "/watch/events", "/metrics"):
        assert server.request("GET", path, headers={"Host": f"evil.example:{server.port}"})[0] == 400
    assert server.request("GET", "/v1/models", headers={"Host": f"localhost:{server.port}"})[0] == 200


def test_serve_on_a_port_in_use_is_one_line_and_exit_2_before_the_model_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from swarm.cli import main

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        # (no such model: the port is checked first)
        assert main(["serve", "--port", str(port), "--model", str(tmp_path / "missing.gguf")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"port {port} is already in use" in err, err


def test_an_error_inside_the_servers_task_group_is_one_line(serve_gguf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from swarm.cli import main

    assert main(["serve", "--port", "0", "--model", str(serve_gguf), "--grace", "-1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--grace must be at least 0" in err, err
