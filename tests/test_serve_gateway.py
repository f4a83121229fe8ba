"""`swarm serve`'s gateway under load it must not buckle under: a huge body, a
churn of callers, a queue bound, in this process on the KV test engine (fast,
thousands of turns) with the tiny model's real tokenizer, so every step and
every record can be checked. Synchronisation is explicit: threading events held
by the test, never a sleep or a wall-clock threshold."""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from kv_engine import KVEngine

from gpu.model.load import load_model
from gpu.model.tokenizer import Tokenizer
from swarm import Swarm
from swarm.server import ServerHandle, serve
from swarm.server.gateway import Gateway
from swarm.server.protocol import parse_completion

MODEL = "tiny"


@pytest.fixture(scope="module")
def tokenizer(serve_gguf: Path) -> Tokenizer:
    return Tokenizer.from_model(load_model(serve_gguf))


def kv_engine(tokenizer: Any, engine_class: type[KVEngine] = KVEngine) -> KVEngine:
    """The KV test engine speaking the tiny model's vocabulary: 16,384 positions."""
    engine = engine_class(num_blocks=1024, block_size=16, vocab=tokenizer.vocab_size)
    engine.tokenizer = tokenizer
    return engine


async def started(swarm: Swarm, tg: Any, **options: Any) -> ServerHandle:
    return await tg.start(
        lambda task_status: serve(swarm, model_id=MODEL, port=0, handle_signals=False, task_status=task_status, **options)
    )


def chat(content: str, **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "temperature": 0, **fields}


async def data_lines(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    async for line in response.aiter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[len("data: ") :])


# ------------------------------------------------------------------ big bodies


class HeldTokenizer:
    """The tiny model's tokenizer, except that a chat longer than `big` characters
    waits at `gate` before it is tokenized, once it has said where it runs: in a
    worker thread it waits; on the event loop's thread it would stall everything,
    so there it only notes `on_loop` and goes on."""

    def __init__(self, real: Tokenizer, big: int) -> None:
        self.real = real
        self.big = big
        self.loop_thread = threading.get_ident()
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.on_loop = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def chat(self, messages: Any, add_generation_prompt: bool = True, *, tools: Any = ()) -> list[int]:
        if sum(len(m["content"] or "") for m in messages) > self.big:
            self.on_loop = threading.get_ident() == self.loop_thread
            self.entered.set()
            if not self.on_loop:
                self.gate.wait(120)
        return self.real.chat(messages, add_generation_prompt, tools=tools)


@pytest.mark.asyncio
async def test_a_large_body_is_tokenized_off_the_loop_while_another_stream_goes_on(tokenizer: Tokenizer) -> None:
    held = HeldTokenizer(tokenizer, big=10_000)
    engine = kv_engine(held)
    big = chat("hello " * 20_000, max_tokens=2)  # 120 KB: under the size refused untokenized, over the context once tokenized
    async with Swarm(engine, slots=2) as swarm, anyio.create_task_group() as tg:
        handle = await started(swarm, tg)
        async with httpx.AsyncClient(base_url=handle.url, timeout=120) as http:
            body = chat("hi", max_tokens=3000, ignore_eos=True, stream=True)
            async with http.stream("POST", "/v1/chat/completions", json=body, headers={"X-Swarm-Agent": "reader"}) as stream:
                chunks = data_lines(stream)
                await anext(chunks)
                answer: list[httpx.Response] = []

                async def post_big() -> None:
                    answer.append(await http.post("/v1/chat/completions", json=big))

                tg.start_soon(post_big)
                await anyio.to_thread.run_sync(held.entered.wait, 120)
                assert not held.on_loop, "the big prompt was tokenized on the event loop"
                # While it is held in its worker thread, the owner steps and the stream flows.
                steps = engine.steps
                for _ in range(20):
                    await anext(chunks)
                assert engine.steps > steps
                assert not answer  # (still held)
                held.gate.set()
                await anext(chunks)
            with anyio.fail_after(120):
                while not answer:
                    await anyio.sleep(0.01)
        error = answer[0].json()["error"]
        assert answer[0].status_code == 400 and error["code"] == "context_length_exceeded", error
        handle.shutdown()


@pytest.mark.asyncio
async def test_a_body_too_long_for_any_tokenization_to_fit_is_refused_untokenized(tokenizer: Tokenizer) -> None:
    held = HeldTokenizer(tokenizer, big=10_000)
    engine = kv_engine(held)
    async with Swarm(engine, slots=2) as swarm, anyio.create_task_group() as tg:
        handle = await started(swarm, tg)
        async with httpx.AsyncClient(base_url=handle.url, timeout=120) as http:
            reply = await http.post("/v1/chat/completions", json=chat("hello " * 650_000, max_tokens=2))  # 3.9 MB
            assert reply.status_code == 400 and reply.json()["error"]["code"] == "context_length_exceeded"
            assert "at least" in reply.json()["error"]["message"]
            assert not held.entered.is_set()  # refused before any tokenizing
            reply = await http.post("/v1/completions", json={"model": MODEL, "prompt": "hello " * 650_000, "max_tokens": 2})
            assert reply.status_code == 400 and reply.json()["error"]["code"] == "context_length_exceeded"
            reply = await http.post("/v1/chat/completions", json=chat("hello", max_tokens=2))
            assert reply.status_code == 200  # and the server goes on
        handle.shutdown()


# ------------------------------------------------------------------ many callers


@pytest.mark.asyncio
async def test_ten_thousand_callers_come_and_go_and_leave_nothing_behind(tokenizer: Tokenizer) -> None:
    engine = kv_engine(tokenizer)
    callers = 10_000
    async with Swarm(engine, slots=8) as swarm:
        gateway = Gateway(swarm, model_id=MODEL)
        waits = swarm.system.waits
        spec_body = json.dumps({"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 1}).encode()
        served_ok = 0

        async def one(i: int) -> None:
            nonlocal served_ok
            spec = parse_completion(spec_body)
            # Every tenth caller also waits on another caller, as X-Swarm-Waits-On says.
            headers = {"x-swarm-waits-on": f"conn-127.0.0.1:{i - 1}"} if i % 10 == 0 else {}
            caller = gateway.caller(headers, spec, ("127.0.0.1", i))
            async with gateway.turn(caller, spec, gateway.clock()) as served:
                async for _ in served:
                    pass
            assert served.usage()["completion_tokens"] == 1
            served_ok += 1

        with anyio.fail_after(600):
            for start in range(0, callers, 50):  # fifty at a time
                async with anyio.create_task_group() as tg:
                    for i in range(start, start + 50):
                        tg.start_soon(one, i)
        assert served_ok == callers
        assert not gateway.turns and not gateway._in_flight
        # The wait graph holds no trace of any caller: no base, no wait, no part.
        assert not any(name.startswith("conn-") for name in waits._base), len(waits._base)
        assert not waits._holders and not waits._waiters and not waits._parts
        assert not swarm.owner.scheduler.priorities.lent
        assert not swarm.owner.scheduler.turns


@pytest.mark.asyncio
async def test_a_caller_an_agent_waits_on_leaves_nothing_once_the_wait_ends(tokenizer: Tokenizer) -> None:
    from swarm import FOREGROUND, Agent

    engine = kv_engine(tokenizer)
    async with Swarm(engine, slots=2) as swarm:
        gateway = Gateway(swarm, model_id=MODEL)
        waits = swarm.system.waits
        planner = await swarm.spawn(Agent("planner", FOREGROUND))
        for _ in range(3):
            spec = parse_completion(json.dumps({"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 1}).encode())
            caller = gateway.caller({"x-swarm-agent": "aider"}, spec, None)
            with planner.waiting_on("aider"):
                async with gateway.turn(caller, spec, gateway.clock()) as served:
                    async for _ in served:
                        pass
                # The caller's last request has ended; the agent still waits on it.
                assert waits.effective("aider") == FOREGROUND
        assert "aider" not in waits._base and not waits._holders and not waits._parts
        await anyio.wait_all_tasks_blocked()  # (the owner takes the lift's end in)
        assert not swarm.owner.scheduler.priorities.lent


# ------------------------------------------------------------------ the queue bound


class GatedKVEngine(KVEngine):
    """Once `hold` is set, the next step waits at `gate` (`stepping` says it has
    begun): the owner is then busy, and whatever is submitted meanwhile waits to
    be taken in."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.hold = threading.Event()
        self.stepping = threading.Event()
        self.gate = threading.Event()

    def step(self, batch: Any, abandon: Any = None) -> Any:
        if self.hold.is_set():
            self.stepping.set()
            self.gate.wait(120)
        return super().step(batch, abandon)


@pytest.mark.asyncio
async def test_max_queue_counts_only_requests_that_will_wait_for_a_slot(tokenizer: Tokenizer) -> None:
    engine = kv_engine(tokenizer, GatedKVEngine)
    assert isinstance(engine, GatedKVEngine)
    async with Swarm(engine, slots=3) as swarm, anyio.create_task_group() as tg:
        handle = await started(swarm, tg, max_queue=1)
        async with httpx.AsyncClient(base_url=handle.url, timeout=120) as http:

            def stream(agent: str) -> Any:
                body = chat("hi", max_tokens=3000, ignore_eos=True, stream=True)
                return http.stream("POST", "/v1/chat/completions", json=body, headers={"X-Swarm-Agent": agent})

            async with stream("holder") as holder:
                await anext(data_lines(holder))  # it holds one of the three slots
                engine.hold.set()
                await anyio.to_thread.run_sync(engine.stepping.wait, 120)
                # The owner is inside a step: nothing sent now is admitted before it ends.
                # Two requests find a slot free, the third waits (the queue's one place),
                # the fourth would wait behind it: refused.
                async with stream("a") as a, stream("b") as b, stream("c") as c:
                    assert (a.status_code, b.status_code, c.status_code) == (200, 200, 200)
                    body = chat("hi", max_tokens=2)
                    refused = await http.post("/v1/chat/completions", json=body, headers={"X-Swarm-Agent": "d"})
                    assert refused.status_code == 429, refused.text
                    assert refused.json()["error"]["code"] == "queue_full"
                    engine.gate.set()
                    engine.hold.clear()
                    for response in (a, b, c):
                        await anext(data_lines(response))  # each gets its slot in turn
        handle.shutdown()


@pytest.mark.asyncio
async def test_max_queue_0_takes_a_request_that_finds_a_slot_free(tokenizer: Tokenizer) -> None:
    engine = kv_engine(tokenizer)
    async with Swarm(engine, slots=1) as swarm, anyio.create_task_group() as tg:
        handle = await started(swarm, tg, max_queue=0)
        async with httpx.AsyncClient(base_url=handle.url, timeout=120) as http:
            reply = await http.post("/v1/chat/completions", json=chat("hi", max_tokens=2))
            assert reply.status_code == 200, reply.text
        handle.shutdown()


# ------------------------------------------------------------------ the prompt log


@pytest.mark.asyncio
async def test_the_prompt_log_is_private_whatever_the_umask(tokenizer: Tokenizer, tmp_path: Path) -> None:
    log = tmp_path / "prompts.jsonl"
    engine = kv_engine(tokenizer)
    old = os.umask(0)  # the most permissive: every file would be world-writable
    try:
        async with Swarm(engine, slots=1) as swarm, anyio.create_task_group() as tg:
            handle = await started(swarm, tg, log_prompts=log)
            assert stat.S_IMODE(log.stat().st_mode) == 0o600
            async with httpx.AsyncClient(base_url=handle.url, timeout=120) as http:
                assert (await http.post("/v1/chat/completions", json=chat("a secret", max_tokens=2))).status_code == 200
            handle.shutdown()
    finally:
        os.umask(old)
    assert "a secret" in log.read_text()
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


@pytest.mark.asyncio
async def test_careless_tool_requests_are_one_400_each_and_the_server_goes_on(tokenizer: Tokenizer) -> None:
    engine = kv_engine(tokenizer)
    tool = lambda i: {"type": "function", "function": {"name": f"tool_{i}"}}  # noqa: E731
    called = [{"role": "user", "content": "hi"},
              {"role": "assistant", "content": None,
               "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]},
              {"role": "tool", "tool_call_id": "c1", "content": "42"}]  # fmt: skip
    async with Swarm(engine, slots=2) as swarm, anyio.create_task_group() as tg:
        handle = await started(swarm, tg)
        async with httpx.AsyncClient(base_url=handle.url, timeout=120) as http:
            for body, param, says in [
                (chat("hi", tools=[tool(i) for i in range(3000)]), "tools", "at most 128"),
                ({**chat("hi", max_tokens=2), "messages": called}, "messages", "arguments must be the JSON text of an object"),
                (chat("hi", response_format={"type": "json_schema", "json_schema": {"name": "x"}}), "response_format.json_schema", "needs"),
                (
                    chat("hi", tools=[tool(1)], tool_choice={"type": "function", "function": {"name": "tool_2"}}),
                    "tool_choice",
                    "not one of the tools",
                ),
            ]:
                reply = await http.post("/v1/chat/completions", json=body)
                error = reply.json()["error"]
                assert reply.status_code == 400 and error["param"] == param and says in error["message"], error
            reply = await http.post("/v1/chat/completions", json=chat("hello", max_tokens=2))
            assert reply.status_code == 200
        handle.shutdown()


@pytest.mark.asyncio
async def test_a_requests_tool_grammar_is_written_off_the_loop(tokenizer: Tokenizer) -> None:
    from dataclasses import dataclass

    from runtime.toolcalls import HERMES, ToolCallFormat

    threads: list[int] = []

    @dataclass(frozen=True)
    class Noting(ToolCallFormat):
        def grammar(self, *args: Any, **kwargs: Any) -> Any:
            threads.append(threading.get_ident())
            return super().grammar(*args, **kwargs)

    class NotingTokenizer(HeldTokenizer):
        tool_format = Noting(**{k: getattr(HERMES, k) for k in HERMES.__dataclass_fields__})

    engine = kv_engine(NotingTokenizer(tokenizer, big=10**9))
    tools = [
        {"type": "function", "function": {"name": f"tool_{i}", "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}}
        for i in range(16)
    ]
    async with Swarm(engine, slots=2) as swarm, anyio.create_task_group() as tg:
        handle = await started(swarm, tg)
        async with httpx.AsyncClient(base_url=handle.url, timeout=120) as http:
            reply = await http.post("/v1/chat/completions", json=chat("hi", max_tokens=2, tools=tools))
            assert reply.status_code == 400 and "cannot constrain" in reply.json()["error"]["message"]  # (the KV engine has no vocabulary)
        assert threads and threading.get_ident() not in threads
        handle.shutdown()
