"""Tools from typed callables, the tool-call text format, and the grammar that
makes a call always parse and name a real tool (runtime.tools, runtime.toolcalls).

The grammar is checked with llguidance itself over a byte-level vocabulary: a
text is accepted when the matcher takes each of its bytes and ends accepting.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

import anyio
import llguidance
import msgspec
import pytest

from runtime.errors import UsageError
from runtime.toolcalls import HERMES, ToolCall, template_messages
from runtime.tools import Tool, tool, tools_by_name, unknown_tool


class _Bytes:
    """A vocabulary of the 256 bytes and an end token, for llguidance."""

    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([b]) for b in range(256)] + [b"<eos>"]
    special_token_ids = [256]

    def __call__(self, text: str | bytes) -> list[int]:
        return list(text if isinstance(text, bytes) else text.encode())


BYTES = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()))


def accepts(lark: str, text: str) -> bool:
    grammar = llguidance.LLMatcher.grammar_from_lark(lark)
    assert llguidance.LLMatcher.validate_grammar(grammar, BYTES) == ""
    matcher = llguidance.LLMatcher(BYTES, grammar, log_level=0)
    return matcher.consume_tokens(list(text.encode())) and matcher.is_accepting()


class Place(msgspec.Struct):
    city: str
    country: str = "FR"


@tool(timeout_s=5)
async def weather(place: Place, unit: Literal["C", "F"] = "C") -> dict:
    """The weather at a place.

    Longer notes the model does not need."""
    return {"city": place.city, "t": 21, "unit": unit}


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def call_text(name: str, arguments: dict) -> str:
    return HERMES.render_call(name, json.dumps(arguments))


# ------------------------------------------------------------------ tools


def test_a_tools_schema_comes_from_its_type_hints() -> None:
    spec = Tool.of(weather).spec
    assert spec.name == "weather"
    assert spec.description == "The weather at a place."
    params = spec.parameters
    assert params["type"] == "object" and params["required"] == ["place"]
    assert params["properties"]["unit"] == {"enum": ["C", "F"], "default": "C"}
    assert params["properties"]["place"] == {"$ref": "#/$defs/Place"}
    assert params["$defs"]["Place"]["required"] == ["city"]
    assert params["additionalProperties"] is False


def test_annotated_limits_are_part_of_the_schema() -> None:
    def short(word: Annotated[str, msgspec.Meta(pattern="^[a-z]+$", max_length=6)]) -> str:
        return word

    assert Tool.of(short).spec.parameters["properties"]["word"] == {"type": "string", "pattern": "^[a-z]+$", "maxLength": 6}


def test_a_tool_is_called_with_its_arguments_decoded_to_their_types() -> None:
    outcome = anyio.run(Tool.of(weather).run, b'{"place": {"city": "Lyon"}, "unit": "F"}')
    assert outcome.status == "ok"
    assert json.loads(outcome.text) == {"city": "Lyon", "t": 21, "unit": "F"}
    assert anyio.run(Tool.of(add).run, '{"a": 2, "b": 3}').text == "5"  # a plain function runs off the loop


def test_what_goes_wrong_in_a_tool_comes_back_as_its_result() -> None:
    async def broken(path: str) -> str:
        raise FileNotFoundError(path)

    async def slow(path: str) -> str:
        await anyio.sleep_forever()
        return path

    async def scenario() -> None:
        failed = await Tool.of(broken).run('{"path": "x.py"}')
        assert (failed.status, failed.text) == ("error", "error: broken raised FileNotFoundError: x.py")
        bad = await Tool.of(add).run('{"a": "two", "b": 3}')
        assert bad.status == "error" and "invalid arguments for add" in bad.text and "$.a" in bad.text
        with anyio.move_on_after(60):  # only a guard: the tool's own limit ends it long before
            late = await Tool.of(tool(slow, timeout_s=0.01)).run('{"path": "x"}')
        assert (late.status, late.text) == ("timeout", "error: slow timed out after 0.01 s")

    anyio.run(scenario)
    missing = unknown_tool("rm_rf", ["add", "weather"])
    assert missing.status == "unknown" and "no tool named 'rm_rf'" in missing.text and "add, weather" in missing.text


def test_tools_need_typed_keyword_parameters_and_distinct_names() -> None:
    def untyped(x):  # noqa: ANN001
        return x

    def star(*args: int) -> None: ...

    with pytest.raises(UsageError, match="needs a type hint"):
        Tool.of(untyped)
    with pytest.raises(UsageError, match="passable by keyword"):
        Tool.of(star)
    with pytest.raises(UsageError, match="two tools are named 'add'"):
        tools_by_name([add, add])
    with pytest.raises(UsageError, match="tool name"):
        Tool.of(tool(add, name="no spaces allowed"))


# ----------------------------------------------------------------- grammar

SPECS = [Tool.of(weather).spec, Tool.of(add).spec]


def test_under_auto_the_model_answers_calls_or_both_real_tools_with_valid_arguments() -> None:
    lark = HERMES.grammar(SPECS, "auto")
    assert accepts(lark, "It is sunny.")
    assert accepts(lark, call_text("add", {"a": 1, "b": 2}))
    assert accepts(lark, call_text("weather", {"place": {"city": "Oslo"}}) + "\n" + call_text("add", {"a": 1, "b": 2}))
    assert not accepts(lark, call_text("rm_rf", {}))  # no tool has that name
    assert not accepts(lark, "Sure! " + call_text("rm_rf", {}))  # nor through the answer's text
    # Text, then calls: it stops at the call block's opening, and what follows is calls.
    assert accepts(lark, "Let me add.\n" + call_text("add", {"a": 1, "b": 2}))
    assert accepts(lark, "First <b>this</b>: " + call_text("add", {"a": 1, "b": 2}) + "\n" + call_text("add", {"a": 3, "b": 4}))
    assert not accepts(lark, "Let me add.\n" + call_text("add", {"a": 1, "b": 2}) + "\nDone.")
    assert not accepts(lark, "Half <tool_call> a call")
    assert not accepts(lark, call_text("add", {"a": "1", "b": 2}))  # a string where an int goes
    assert not accepts(lark, call_text("add", {"a": 1}))  # a required argument missing
    assert not accepts(lark, call_text("add", {"a": 1, "b": 2, "c": 3}))  # one it does not take
    assert not accepts(lark, call_text("weather", {"place": {"city": "Oslo"}, "unit": "K"}))  # not in the enum


def test_required_named_and_single_call_choices() -> None:
    required = HERMES.grammar(SPECS, "required")
    assert not accepts(required, "It is sunny.")
    assert accepts(required, call_text("add", {"a": 1, "b": 2}))
    named = HERMES.grammar(SPECS, "weather")
    assert accepts(named, call_text("weather", {"place": {"city": "Oslo"}}))
    assert not accepts(named, call_text("add", {"a": 1, "b": 2}))
    assert not accepts(named, call_text("weather", {"place": {"city": "A"}}) + "\n" + call_text("weather", {"place": {"city": "B"}}))
    single = HERMES.grammar(SPECS, "auto", parallel=False)
    assert accepts(single, call_text("add", {"a": 1, "b": 2}))
    assert not accepts(single, call_text("add", {"a": 1, "b": 2}) + "\n" + call_text("add", {"a": 1, "b": 2}))
    assert accepts(single, "So: " + call_text("add", {"a": 1, "b": 2}))
    assert not accepts(single, "So: " + call_text("add", {"a": 1, "b": 2}) + "\n" + call_text("add", {"a": 1, "b": 2}))
    assert HERMES.grammar(SPECS, "none") is None
    json_answer = HERMES.grammar(
        SPECS, "auto", answer_schema={"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    )
    assert accepts(json_answer, '{"ok": true}') and accepts(json_answer, call_text("add", {"a": 1, "b": 2}))
    assert not accepts(json_answer, "It is sunny.")
    with pytest.raises(UsageError, match="'nope', which is not one of the tools"):
        HERMES.grammar(SPECS, "nope")


# ------------------------------------------------------------ parse, render


def test_calls_parse_back_and_text_that_is_no_call_stays_text() -> None:
    text = call_text("add", {"a": 1, "b": 2}) + "\n" + call_text("weather", {"place": {"city": "Oslo"}})
    content, calls = HERMES.parse(text)
    assert content == ""
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("add", {"a": 1, "b": 2}), ("weather", {"place": {"city": "Oslo"}})]
    assert all(c.id.startswith("call_") for c in calls) and calls[0].id != calls[1].id
    assert HERMES.parse("<tool_call>\nnot json\n</tool_call>") == ("<tool_call>\nnot json\n</tool_call>", [])
    assert HERMES.parse("Just an answer.") == ("Just an answer.", [])
    cut = HERMES.parse(call_text("add", {"a": 1, "b": 2}) + '\n<tool_call>\n{"name')  # out of tokens in the second
    assert cut[0] == "" and [c.name for c in cut[1]] == ["add"]
    said = HERMES.parse("Let me add.\n" + call_text("add", {"a": 1, "b": 2}))  # text, then a call
    assert said[0] == "Let me add." and [c.name for c in said[1]] == ["add"]


def test_a_conversation_with_calls_folds_into_plain_messages_for_a_template_without_tools() -> None:
    messages = [
        {"role": "user", "content": "add 1 and 2"},
        {"role": "assistant", "content": None, "tool_calls": [ToolCall("call_1", "add", '{"a": 1, "b": 2}').as_openai()]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3"},
        {"role": "tool", "tool_call_id": "call_2", "content": "4"},
    ]
    folded = HERMES.fold(messages, SPECS)
    assert [m["role"] for m in folded] == ["system", "user", "assistant", "user"]
    assert '"name": "weather"' in folded[0]["content"] and "<tools>" in folded[0]["content"]
    assert folded[2]["content"] == '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    assert folded[3]["content"] == "<tool_response>\n3\n</tool_response>\n<tool_response>\n4\n</tool_response>"
    # Hugging Face templates take a call's arguments as an object
    assert template_messages(messages)[1]["tool_calls"][0]["function"]["arguments"] == {"a": 1, "b": 2}


CONVERSATION = [
    {"role": "user", "content": "add 1 and 2"},
    {"role": "assistant", "content": None, "tool_calls": [ToolCall("call_1", "add", '{"a": 1, "b": 2}').as_openai()]},
    {"role": "tool", "tool_call_id": "call_1", "content": "3"},
]


@pytest.mark.fetched_model
def test_the_fold_writes_tools_calls_and_results_word_for_word_as_qwens_own_template() -> None:
    from gpu.model.catalogue import CATALOGUE
    from gpu.model.fetch import cached
    from gpu.model.load import load_model
    from gpu.model.tokenizer import Tokenizer

    path = cached(CATALOGUE["qwen2.5-coder-0.5b"])
    if path is None:
        pytest.skip("qwen2.5-coder-0.5b is not in the model cache; fetch it with `swarm models --fetch qwen2.5-coder-0.5b`")
    qwen = Tokenizer.from_model(load_model(path))
    native = qwen.render_chat(CONVERSATION, tools=SPECS)  # Qwen's template reads `tools` itself
    system = {"role": "system", "content": "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."}
    folded = qwen.render_chat(HERMES.fold([system, *CONVERSATION], SPECS))  # as SmolLM2 and Gemma get it
    assert native == folded


def test_a_template_without_tools_gets_them_folded_in(tiny_model) -> None:
    from gpu.model.tokenizer import Tokenizer

    text = Tokenizer.from_model(tiny_model).render_chat(CONVERSATION, tools=SPECS)
    assert "<tools>\n" in text and '"name": "weather"' in text
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call><|im_end|>' in text
    assert "<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>" in text


def test_a_conversation_whose_calls_do_not_parse_is_one_usage_error() -> None:
    from runtime.toolcalls import HERMES, template_messages

    user = {"role": "user", "content": "hi"}
    for calls in ([{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{not json"}}],
                  [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[1, 2]"}}],
                  [{"id": "c1", "type": "function", "function": {"arguments": "{}"}}],
                  ["f()"]):  # fmt: skip
        conversation = [user, {"role": "assistant", "content": None, "tool_calls": calls}]
        with pytest.raises(UsageError, match="tool call"):
            template_messages(conversation)
        with pytest.raises(UsageError, match="tool call"):
            HERMES.fold(conversation, [])


@pytest.mark.fetched_model
@pytest.mark.parametrize("name", ["smollm2-135m", "qwen2.5-coder-0.5b"])
def test_text_then_a_call_is_taken_token_by_token_in_each_models_own_tokens(name: str) -> None:
    # Qwen writes the opening tag as one token of its own; SmolLM2 in pieces: either
    # way the text stops there, and the call after it is held to the tools.
    from gpu.grammar import ConstraintCompiler
    from gpu.model.catalogue import CATALOGUE
    from gpu.model.fetch import cached
    from gpu.model.load import load_model
    from gpu.model.tokenizer import Tokenizer
    from runtime.scheduling.constraints import Grammar

    path = cached(CATALOGUE[name])
    if path is None:
        pytest.skip(f"{name} is not in the model cache; fetch it with `swarm models --fetch {name}`")
    tokenizer = Tokenizer.from_model(load_model(path))
    compiler = ConstraintCompiler(tokenizer, tokenizer.vocab_size)
    grammar = Grammar(HERMES.grammar(SPECS, "auto"))

    def takes(text: str) -> bool:
        matcher = compiler.matcher(grammar)
        return matcher.consume_tokens(tokenizer.encode(text)) and matcher.is_accepting()

    call = call_text("add", {"a": 1, "b": 2})
    if name.startswith("qwen"):
        assert len(tokenizer.encode("<tool_call>")) == 1
    assert takes("Let me add them.\n" + call) and takes(call) and takes("It is 3.")
    assert not takes("Let me add them.\n" + call_text("rm_rf", {}))
