"""Typed answers and tool calls for in-process agents, on the tiny model.

The tiny model's weights are noise: whatever these turns say is held to its
constraint, so every answer parses and every call names a real tool with
valid arguments (runtime.agent: complete(schema=...), use_tools).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

import anyio
import msgspec
import pytest

from gpu.engine import OpenCLEngine
from runtime.events.kinds import Finished, ToolCalled
from runtime.toolcalls import ToolCall
from runtime.tools import Tool
from swarm import Agent, Sampling, Swarm, TurnFailed, UsageError, tool

Word = Annotated[str, msgspec.Meta(pattern="^[a-z]{1,6}$")]


class Finding(msgspec.Struct):
    file: Word
    line: Annotated[int, msgspec.Meta(ge=1, le=999)]
    severity: Literal["low", "high"]
    tags: Annotated[list[Word], msgspec.Meta(max_length=2)]


@pytest.fixture(scope="module")
def tiny_engine(serve_gguf: Path) -> OpenCLEngine:
    """The tiny model with a 4096-token context: a prompt that lists tools is long
    in a vocabulary of bytes."""
    return OpenCLEngine(serve_gguf)


async def spawn(swarm: Swarm, agent: Agent) -> Agent:
    await swarm.spawn(agent)
    return agent


@pytest.mark.asyncio
async def test_typed_answers_parse_whatever_the_weights(tiny_engine) -> None:
    with anyio.fail_after(300):
        async with Swarm(tiny_engine, slots=2) as swarm:
            agent = await spawn(swarm, Agent("typed"))
            finding = await agent.complete("Report one finding.", schema=Finding, max_tokens=120)
            assert isinstance(finding, Finding) and 1 <= finding.line <= 999
            as_dict = await agent.complete(
                "Same, as JSON.",
                schema={"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False},
                max_tokens=20,
            )
            assert set(as_dict) == {"ok"} and isinstance(as_dict["ok"], bool)
            assert await agent.complete("Yes or no?", choices=["yes", "no"], max_tokens=4) in ("yes", "no")
            code = await agent.complete("A code.", regex="[A-F][0-9]{3}", max_tokens=8)
            assert len(code) == 4 and code[0] in "ABCDEF" and code[1:].isdigit()
            # streamed like a free turn: the pieces add up to the constrained text
            pieces = []
            async with agent.generate("Count.", regex="(ab){3}", max_tokens=10) as turn:
                async for piece in turn:
                    pieces.append(piece)
            assert "".join(pieces) == turn.text == "ababab"
            sampled = await agent.complete("A finding.", schema=Finding, max_tokens=120, sampling=Sampling(temperature=1.0, seed=7))
            assert isinstance(sampled, Finding)


@pytest.mark.asyncio
async def test_a_bad_constraint_is_refused_before_the_turn_is_queued(tiny_engine) -> None:
    with anyio.fail_after(120):
        async with Swarm(tiny_engine, slots=1) as swarm:
            agent = await spawn(swarm, Agent("typed"))
            with pytest.raises(UsageError, match="if"):
                await agent.complete("x", schema={"if": {"type": "string"}}, max_tokens=4)
            with pytest.raises(UsageError, match="one constraint"):
                agent.generate("x", regex="a", choices=["a"])
            # an answer cut short by max_tokens is a clear failure, not a decode crash
            with pytest.raises(TurnFailed, match="before it was whole JSON"):
                await agent.complete("x", schema=list[int], max_tokens=1)


class Toolsmith(Agent):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.side_turn_text: str | None = None

    @tool
    async def broken(self, path: Word) -> str:
        """Read a file (always fails)."""
        raise FileNotFoundError(path)

    @tool(timeout_s=0.05)
    async def stuck(self, path: Word) -> str:
        """Never answers."""
        await anyio.sleep_forever()
        return path

    @tool
    async def side_turn(self, n: Annotated[int, msgspec.Meta(ge=0, le=9)]) -> str:
        """Runs a turn of its own: with one slot, only possible if the tool loop's turn let it go."""
        self.side_turn_text = await self.complete("side", max_tokens=2)
        return str(n)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("name", "status", "says"),
    [
        ("broken", "error", "error: broken raised FileNotFoundError"),
        ("stuck", "timeout", "error: stuck timed out after 0.05 s"),
    ],
)
async def test_a_failing_or_stuck_tool_answers_the_model_with_its_error(tiny_engine, name, status, says) -> None:
    with anyio.fail_after(300):
        async with Swarm(tiny_engine, slots=1) as swarm:
            agent = await spawn(swarm, Toolsmith("smith"))
            second: list[dict] = []
            answer = await agent.use_tools(
                "Read a.py", tools=[agent.broken, agent.stuck], tool_choice=name, max_rounds=1, max_tokens=200, transcript=second
            )
            assert isinstance(answer, str)
    # the conversation of round 2 holds the call and the tool's error
    assert len(second) == 3
    assert second[1]["role"] == "assistant" and second[1]["tool_calls"][0]["function"]["name"] == name
    assert json.loads(second[1]["tool_calls"][0]["function"]["arguments"]).keys() == {"path"}
    assert second[2]["role"] == "tool" and second[2]["content"].startswith(says)


@pytest.mark.asyncio
async def test_the_tool_loop_releases_its_slot_while_a_tool_runs_and_logs_name_and_time_only(tiny_engine) -> None:
    with anyio.fail_after(300):
        async with Swarm(tiny_engine, slots=1) as swarm:
            sub = swarm.bus.subscribe(max_buffer=10**9)
            agent = await spawn(swarm, Toolsmith("smith"))
            await agent.use_tools("Go", tools=[agent.side_turn], tool_choice="required", max_rounds=1, max_tokens=200)
            events = []
            async for event in sub:
                events.append(event)
                if sum(isinstance(e, Finished) for e in events) == 3:  # round 1, the side turn, round 2
                    break
    assert agent.side_turn_text is not None  # the one slot was free for it
    calls = [e for e in events if isinstance(e, ToolCalled)]
    assert [(e.agent, e.tool, e.status) for e in calls] == [("smith", "side_turn", "ok")]
    assert set(msgspec.structs.asdict(calls[0])) == {"owner", "t", "step", "agent", "tool", "duration_s", "status"}
    assert calls[0].duration_s > 0


@pytest.mark.asyncio
async def test_a_call_to_an_unknown_tool_in_the_history_is_answered_not_run(tiny_engine) -> None:
    with anyio.fail_after(120):
        async with Swarm(tiny_engine, slots=1) as swarm:
            sub = swarm.bus.subscribe(max_buffer=10**9)
            agent = await spawn(swarm, Toolsmith("smith"))
            tools = {"broken": Tool.of(agent.broken)}
            outcomes = await agent.run_tool_calls([ToolCall("call_1", "rm_rf", '{"path": "/"}')], tools)
            async for event in sub:
                if isinstance(event, ToolCalled):
                    break
    assert outcomes[0].status == "unknown" and "no tool named 'rm_rf'" in outcomes[0].text and "broken" in outcomes[0].text
    assert (event.tool, event.status) == ("rm_rf", "unknown")


@pytest.mark.asyncio
async def test_the_reviewer_answers_with_typed_findings(tiny_engine, tmp_path: Path) -> None:
    from agents.reviewer import Finding, Review, Reviewer, Verdict

    max_tokens = 200
    with anyio.fail_after(300):
        async with Swarm(tiny_engine, slots=1) as swarm:
            reviewer = await spawn(swarm, Reviewer("reviewer", workspace=tmp_path, out=tmp_path / "out", rounds=0, max_tokens=max_tokens))
            asker = await spawn(swarm, Agent("asker"))
            verdict = await asker.ask("reviewer", Review("a.py", "x = 1 / 0\n"), timeout=300)
    assert isinstance(verdict, Verdict) and verdict.path == "a.py"
    assert all(isinstance(f, Finding) and f.line >= 1 and f.severity in ("info", "warning", "error") for f in verdict.findings)
    if not verdict.findings and verdict.text != "No problems found.":
        # held to the schema, the only way to miss it is to run out of tokens first
        assert reviewer.records[-1].tokens == max_tokens


@pytest.mark.asyncio
async def test_a_long_chat_is_tokenized_off_the_event_loop(tiny_engine, monkeypatch) -> None:
    import threading

    tokenizer = tiny_engine.tokenizer
    threads = []

    def chat(messages, *args, **kwargs):
        threads.append(threading.current_thread())
        return type(tokenizer).chat(tokenizer, messages, *args, **kwargs)

    monkeypatch.setattr(tokenizer, "chat", chat)
    loop = threading.current_thread()
    with anyio.fail_after(300):
        async with Swarm(tiny_engine, slots=2) as swarm:
            agent = await spawn(swarm, Agent("reader"))
            await agent.complete("Short.", max_tokens=1)
            long = "ab " * 1400  # past Chat.INLINE_CHARS, still inside the context
            async with agent.generate(long, max_tokens=1) as turn:
                async for _ in turn:
                    pass
    assert threads[0] is loop and threads[1] is not loop
    assert len(turn.prompt) > 100 and turn.ended is not None
