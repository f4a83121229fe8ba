"""Tool calls and structured output through `swarm serve`, driven by the official
`openai` client and by LangChain's ChatOpenAI.

The tiny model's weights are noise, so nothing here checks what it says, only
that what it says is held to the request: every call names a real tool with
arguments of the right types, every JSON answer validates. Schemas bound their
strings and numbers so that noise cannot run a value past max_tokens.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import msgspec
import openai
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field
from serve_helpers import ServerProcess

MODEL = "tiny-serve"
MAX_TOKENS = 300

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "pattern": "^[A-Z][a-z]{1,8}$"},
                "unit": {"enum": ["C", "F"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "integer", "minimum": 0, "maximum": 99}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, ADD]


class WeatherArgs(msgspec.Struct, forbid_unknown_fields=True):
    city: str
    unit: Literal["C", "F"]


class AddArgs(msgspec.Struct, forbid_unknown_fields=True):
    a: int
    b: int


ARGS = {"get_weather": WeatherArgs, "add": AddArgs}

ANSWER_SCHEMA = {
    "type": "object",
    "properties": {
        "verdict": {"enum": ["ok", "bad"]},
        "score": {"type": "integer", "minimum": 1, "maximum": 5},
        "notes": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2},
    },
    "required": ["verdict", "score", "notes"],
    "additionalProperties": False,
}


class Answer(msgspec.Struct, forbid_unknown_fields=True):
    verdict: Literal["ok", "bad"]
    score: int
    notes: list[str]


@pytest.fixture(scope="module")
def server(serve_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with ServerProcess(serve_gguf, "--slots", "2", tmp=tmp_path_factory.mktemp("server")) as server:
        yield server


@pytest.fixture
def client(server: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300) as client:
        yield client


def ask(client: openai.OpenAI, content: str = "What is the weather in Paris?", **kwargs: Any) -> Any:
    kwargs = {"max_tokens": MAX_TOKENS, "temperature": 0, **kwargs}
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], **kwargs)


def stream(
    client: openai.OpenAI, content: str = "What is the weather in Paris?", **kwargs: Any
) -> tuple[str, list[dict[str, Any]], str, list[Any]]:
    """A streamed answer put back together as a client would: its content, its
    calls (from the deltas, by index), its finish reason, and the raw chunks."""
    kwargs = {"max_tokens": MAX_TOKENS, "temperature": 0, **kwargs}
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], stream=True, **kwargs))
    content_parts, calls, finish = [], {}, None
    for chunk in chunks:
        choice = chunk.choices[0]
        assert len(choice.delta.tool_calls or []) <= 1  # one delta a chunk, as OpenAI streams them
        if choice.delta.content:
            content_parts.append(choice.delta.content)
        for delta in choice.delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"id": None, "name": None, "arguments": ""})
            if delta.id is not None:
                call["id"] = delta.id
                assert delta.type == "function" and delta.function.arguments == ""  # OpenAI's first delta of a call
            if delta.function.name is not None:
                call["name"] = delta.function.name
            call["arguments"] += delta.function.arguments or ""
        finish = choice.finish_reason or finish
    return "".join(content_parts), [calls[i] for i in sorted(calls)], finish, chunks


def check_call(name: str, arguments: str) -> None:
    assert name in ARGS
    msgspec.json.decode(arguments, type=ARGS[name])


# ------------------------------------------------------------------ tool calls


def test_required_tool_calls_name_real_tools_with_valid_arguments_whole_and_streamed(client: openai.OpenAI) -> None:
    whole = ask(client, tools=TOOLS, tool_choice="required")
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        check_call(call.function.name, call.function.arguments)
    content, calls, finish, _ = stream(client, tools=TOOLS, tool_choice="required")
    assert finish == "tool_calls" and content == ""
    # greedy: the stream made the very calls the whole answer made (ids apart)
    assert [(c["name"], c["arguments"]) for c in calls] == [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    assert all(c["id"].startswith("call_") for c in calls)


def test_a_named_tool_choice_and_no_parallel_calls(client: openai.OpenAI) -> None:
    named = {"type": "function", "function": {"name": "add"}}
    for message in (ask(client, tools=TOOLS, tool_choice=named).choices[0].message,):
        assert [c.function.name for c in message.tool_calls] == ["add"]
        check_call("add", message.tool_calls[0].function.arguments)
    _, calls, finish, _ = stream(client, tools=TOOLS, tool_choice=named)
    assert [c["name"] for c in calls] == ["add"] and finish == "tool_calls"
    single = ask(client, tools=TOOLS, tool_choice="required", parallel_tool_calls=False).choices[0].message
    assert len(single.tool_calls) == 1


def test_tool_choice_none_answers_in_text_and_auto_answers_or_calls(client: openai.OpenAI) -> None:
    none = ask(client, tools=TOOLS, tool_choice="none", max_tokens=12).choices[0]
    assert none.message.tool_calls is None and isinstance(none.message.content, str)
    auto = ask(client, tools=TOOLS, max_tokens=120).choices[0]
    for call in auto.message.tool_calls or []:
        check_call(call.function.name, call.function.arguments)
    assert auto.finish_reason in ("stop", "length", "tool_calls")
    content, calls, finish, _ = stream(client, tools=TOOLS, max_tokens=120)
    assert (content, [(c["name"], c["arguments"]) for c in calls]) == (
        auto.message.content or "",
        [(c.function.name, c.function.arguments) for c in auto.message.tool_calls or []],
    )


def test_a_conversation_with_calls_results_names_and_an_unknown_tool_in_its_history(client: openai.OpenAI) -> None:
    messages = [
        {"role": "system", "content": "You check the weather.", "name": "setup"},
        {"role": "user", "content": "Weather in Oslo? And delete everything.", "name": "alice"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "C"}'}},
                # a call no tool answers to, written into the history by hand: the
                # grammar never lets the model make one, but a client may send it
                {"id": "call_2", "type": "function", "function": {"name": "rm_rf", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"t": 4}'},
        {"role": "tool", "tool_call_id": "call_2", "content": "error: there is no tool named 'rm_rf'"},
    ]
    reply = client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, tool_choice="required", max_tokens=MAX_TOKENS, temperature=0
    )
    for call in reply.choices[0].message.tool_calls:
        check_call(call.function.name, call.function.arguments)  # never rm_rf


# ------------------------------------------------------------- response_format


def test_json_schema_and_json_object_answers_validate_whole_and_streamed(client: openai.OpenAI) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA, "strict": True}}
    whole = ask(client, "Judge this.", response_format=fmt).choices[0]
    assert whole.finish_reason == "stop"
    msgspec.json.decode(whole.message.content, type=Answer)
    content, calls, finish, _ = stream(client, "Judge this.", response_format=fmt)
    assert (content, calls, finish) == (whole.message.content, [], "stop")
    obj = ask(client, "Any JSON object.", response_format={"type": "json_object"}, max_tokens=60).choices[0]
    if obj.finish_reason == "stop":  # (an object may be long: noise can nest)
        assert isinstance(json.loads(obj.message.content), dict)
    assert ask(client, "Hi", response_format={"type": "text"}, max_tokens=3).choices[0].message.content is not None


def test_tools_with_a_json_answer(client: openai.OpenAI) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA}}
    message = ask(client, tools=TOOLS, response_format=fmt).choices[0].message
    if message.tool_calls:
        for call in message.tool_calls:
            check_call(call.function.name, call.function.arguments)
    else:
        msgspec.json.decode(message.content, type=Answer)


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "object", "if": {"type": "object"}}},
                }
            },
            "response_format",
            "if",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {"type": "object", "properties": {"a": {"type": "string", "format": "weird"}}},
                        },
                    }
                ]
            },
            "tools",
            "weird",
        ),
        ({"tools": []}, "tools", "at least one"),
        ({"tool_choice": "auto"}, "tool_choice", "needs `tools`"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "'nope'"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "sometimes"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name", "two tools"),
        ({"response_format": {"type": "yaml"}}, "response_format.type", "yaml"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id", "tool_call_id"),
        (
            {"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "call_9", "content": "x"}]},
            "messages[1].tool_call_id",
            "'call_9'",
        ),
    ],
)
def test_what_the_grammar_engine_or_the_api_cannot_take_is_a_400_naming_it(
    server: ServerProcess, body: dict[str, Any], param: str, says: str
) -> None:
    request = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **body}
    status, _, data = server.request("POST", "/v1/chat/completions", request)
    assert status == 400, data
    error = json.loads(data)["error"]
    assert error["param"] == param and says in error["message"], error


HISTORY = [
    {"role": "user", "content": "Weather in Oslo?", "name": "alice"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "C"}'}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"t": 4}'},
]


@pytest.mark.parametrize(
    "params",
    [
        {"tools": TOOLS, "tool_choice": "none", "max_tokens": 16},
        {"tools": TOOLS, "tool_choice": "auto"},
        {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False},
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "parallel_tool_calls": True},
        {"response_format": {"type": "json_object"}, "max_tokens": 40},
        {"response_format": {"type": "text"}, "max_tokens": 8},
        {"tools": TOOLS, "tool_choice": "required", "messages": HISTORY},
    ],
    ids=["none", "auto", "required-single", "named-parallel", "json_object", "text", "history"],
)
def test_streamed_and_whole_say_the_same(client: openai.OpenAI, params: dict[str, Any]) -> None:
    params = {"max_tokens": MAX_TOKENS, "temperature": 0, "messages": [{"role": "user", "content": "Weather in Paris?"}], **params}
    whole = client.chat.completions.create(model=MODEL, **params).choices[0]
    content, calls = "", {}
    finish = None
    for chunk in client.chat.completions.create(model=MODEL, stream=True, **params):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for d in delta.tool_calls or []:
            call = calls.setdefault(d.index, {"name": d.function.name, "arguments": ""})
            call["arguments"] += d.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    got = [(c["name"], c["arguments"]) for _, c in sorted(calls.items())]
    assert (content, got, finish) == (
        whole.message.content or "",
        [(c.function.name, c.function.arguments) for c in whole.message.tool_calls or []],
        whole.finish_reason,
    )
    for name, arguments in got:
        check_call(name, arguments)
    if params.get("tool_choice", "none") not in ("none", "auto"):  # (under auto the model may answer, call or both)
        assert finish == "tool_calls" and got
    if params.get("parallel_tool_calls") is False or isinstance(params.get("tool_choice"), dict):
        assert len(got) == 1


# ------------------------------------------------------------------ LangChain


class Weather(BaseModel):
    """The weather in a city."""

    city: str = Field(pattern="^[A-Z][a-z]{1,8}$")
    unit: Literal["C", "F"]


class Verdict(BaseModel):
    """A verdict on some code."""

    verdict: Literal["ok", "bad"]
    score: int = Field(ge=1, le=5)


@pytest.fixture
def llm(server: ServerProcess) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=server.url + "/v1", api_key="unused", model=MODEL, temperature=0, max_tokens=MAX_TOKENS, max_retries=0, timeout=300
    )


def test_langchain_bind_tools_calls_the_tool_and_takes_its_result_back(llm: ChatOpenAI) -> None:
    bound = llm.bind_tools([Weather], tool_choice="Weather")
    first = bound.invoke([HumanMessage("Weather in Paris?")])
    assert isinstance(first, AIMessage) and [c["name"] for c in first.tool_calls] == ["Weather"]
    Weather(**first.tool_calls[0]["args"])
    chunks = list(bound.stream([HumanMessage("Weather in Paris?")]))
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk
    assert [(c["name"], c["args"]) for c in merged.tool_calls] == [(c["name"], c["args"]) for c in first.tool_calls]
    result = ToolMessage(content='{"t": 20}', tool_call_id=first.tool_calls[0]["id"])
    after = llm.bind_tools([Weather]).invoke([HumanMessage("Weather in Paris?"), first, result])
    assert isinstance(after, AIMessage)
    for call in after.tool_calls:
        Weather(**call["args"])


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_structured_output(llm: ChatOpenAI, method: str) -> None:
    verdict = llm.with_structured_output(Verdict, method=method).invoke("Judge: x = 1")
    assert isinstance(verdict, Verdict) and 1 <= verdict.score <= 5


def test_the_splitter_sends_text_as_it_comes_and_each_call_when_its_block_closes() -> None:
    from runtime.toolcalls import HERMES
    from swarm.server.calls import CallSplitter

    two = HERMES.render_call("add", '{"a": 1, "b": 2}') + "\n" + HERMES.render_call("add", '{"a": 3, "b": 4}')
    splitter = CallSplitter(HERMES)
    out = [item for i in range(0, len(two), 7) for item in splitter.push(two[i : i + 7])] + splitter.finish()
    assert [(c.name, c.arguments) for c in out] == [("add", '{"a": 1, "b": 2}'), ("add", '{"a": 3, "b": 4}')]
    assert splitter.calls == out
    text = CallSplitter(HERMES)
    assert text.push("<to") == [] and text.push("day is fine") == ["<today is fine"] and text.push(" indeed") == [" indeed"]
    cut = CallSplitter(HERMES)  # out of tokens inside a call: what it wrote goes out as text
    assert cut.push('<tool_call>\n{"name": "ad') == [] and cut.finish() == ['<tool_call>\n{"name": "ad']
    after = CallSplitter(HERMES)  # ... and after whole calls, the cut one is dropped, as parse drops it
    assert [c.name for c in after.push(two + '\n<tool_call>\n{"na')] == ["add", "add"] and after.finish() == []
    # Text, then calls: the text goes out as it comes, but for what may open a block
    # (and the blank before it); piece by piece, it says what parse says of the whole.
    both = "Let me <b>add</b> these.\n" + two
    for size in (1, 3, 7, len(both)):
        split = CallSplitter(HERMES)
        out = [item for i in range(0, len(both), size) for item in split.push(both[i : i + size])] + split.finish()
        text, calls = HERMES.parse(both)
        assert "".join(x for x in out if isinstance(x, str)) == text == "Let me <b>add</b> these."
        assert [(c.name, c.arguments) for c in out if not isinstance(c, str)] == [(c.name, c.arguments) for c in calls]
    held = CallSplitter(HERMES)
    assert held.push("Sure.\n<tool") == ["Sure."] and held.push("box>") == ["\n<toolbox>"]
