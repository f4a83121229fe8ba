"""Outside and in-process agents in one swarm: priority inheritance across the
HTTP boundary, both ways. The server runs in this process (as a program embedding
slotswarm would run it), on a real loopback socket, spoken to by the openai client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import openai
import pytest

from runtime.events.kinds import Event, Inherited, Queued, Restored
from swarm import BACKGROUND, FOREGROUND, Agent, Swarm
from swarm.server import ServerHandle, serve

MODEL = "tiny"


@pytest.fixture(scope="module")
def engine(tiny_gguf: Path) -> Any:
    from gpu.engine import OpenCLEngine

    return OpenCLEngine(tiny_gguf)


class Lead(Agent):
    """A foreground agent waiting for an outside one (an HTTP caller) to answer."""

    def __init__(self, name: str, on: str) -> None:
        super().__init__(name, FOREGROUND)
        self.on = on
        self.waiting = anyio.Event()
        self.done = anyio.Event()

    async def run(self) -> None:
        with self.waiting_on(self.on):
            self.waiting.set()
            await self.done.wait()


class Idle(Agent):
    pass


async def started(swarm: Swarm, tg: Any) -> ServerHandle:
    return await tg.start(lambda task_status: serve(swarm, model_id=MODEL, port=0, handle_signals=False, task_status=task_status))


def events_of(log: list[Event], *kinds: type) -> list[Event]:
    return [e for e in log if isinstance(e, kinds)]


@pytest.mark.asyncio
async def test_an_in_process_agent_lends_its_priority_to_an_http_caller(engine: Any) -> None:
    async with Swarm(engine, slots=2) as swarm, anyio.create_task_group() as tg:
        log = swarm.bus.subscribe()
        handle = await started(swarm, tg)
        lead = await swarm.spawn(Lead("lead", on="aider"))
        await lead.waiting.wait()
        async with openai.AsyncOpenAI(base_url=handle.url + "/v1", api_key="-", max_retries=0) as client:
            reply = await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=3,
                temperature=0,
                extra_headers={"X-Swarm-Agent": "aider"},
            )  # background by default
        assert reply.usage.completion_tokens >= 1
        lead.done.set()
        await swarm.join(lead)
        handle.shutdown()
    seen = [e async for e in log if isinstance(e, Event)]
    inherited = events_of(seen, Inherited)
    assert [(e.agent, e.priority, e.base_priority, e.by_agent) for e in inherited] == [("aider", FOREGROUND, BACKGROUND, "lead")]
    queued = next(e for e in seen if isinstance(e, Queued) and e.agent == "aider")
    assert queued.priority == FOREGROUND  # its turn ran at the lead's priority
    assert events_of(seen, Restored)[-1].agent == "aider"


@pytest.mark.asyncio
async def test_an_http_caller_waiting_on_an_in_process_agent_lends_it_its_priority(engine: Any) -> None:
    async with Swarm(engine, slots=2) as swarm, anyio.create_task_group() as tg:
        log = swarm.bus.subscribe()
        handle = await started(swarm, tg)
        helper = await swarm.spawn(Idle("helper"))
        async with openai.AsyncOpenAI(base_url=handle.url + "/v1", api_key="-", max_retries=0) as client:
            # While this foreground caller's request runs, it declares it waits on the helper.
            stream = await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=200,
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True},
                extra_headers={"X-Swarm-Agent": "human", "X-Swarm-Priority": "foreground", "X-Swarm-Waits-On": "helper"},
            )
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    assert helper.effective_priority == FOREGROUND
                    break
            await stream.close()
            with anyio.fail_after(30):
                while helper.effective_priority != BACKGROUND:  # the hang-up ends the wait
                    await anyio.sleep(0.01)
            # A caller may not wait on an agent that waits on it: the cycle is a clear 400.
            with helper.waiting_on("human2"), pytest.raises(openai.BadRequestError, match="cycle"):
                await client.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "hi"}],
                    max_tokens=2,
                    extra_headers={"X-Swarm-Agent": "human2", "X-Swarm-Waits-On": "helper"},
                )
        handle.shutdown()
    seen = [e async for e in log if isinstance(e, Event)]
    assert [(e.agent, e.priority, e.by_agent) for e in events_of(seen, Inherited)] == [("helper", FOREGROUND, "human")]
    assert [e.agent for e in events_of(seen, Restored)] == ["helper"]
