"""Tool calls as text: how the model writes them, the grammar that makes every
call it writes parse, and how the text is read back into calls.

Every catalogue model writes calls the way Qwen2.5's chat template asks (the
"Hermes" format most open models share), one block a call, blocks one a line:

    <tool_call>
    {"name": "read_file", "arguments": {"path": "main.py"}}
    </tool_call>

and reads each result back in a `<tool_response>` block of a user turn.
Qwen2.5's own template renders the tools, the calls and the results. SmolLM2's
(plain ChatML) and Gemma 3 270M (no template) do not know tools: for them
`fold_tools` writes the same text into ordinary messages first, the tools into
the system message in Qwen's words. One format for all keeps the grammar and the
parser one piece of code; a model with a different native format would get a
`ToolCallFormat` of its own here.

The grammar is llguidance's Lark dialect, each call an embedded JSON Schema
(`%json{...}`) whose `name` is that tool's name and whose `arguments` are its
parameters' schema. So under a constraint a call always parses, names a real
tool and carries valid arguments, whatever the weights say.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from runtime.errors import UsageError
from runtime.tools import ToolSpec


class ToolCall(msgspec.Struct, frozen=True):
    """One call the model made: OpenAI's `{"id", "type": "function", "function": {"name", "arguments"}}`."""

    id: str
    name: str
    arguments: str  # the arguments object as JSON text, as OpenAI sends it

    def as_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


# "auto": answer, call, or both (text, then calls); "none": answer; "required": call at least one tool;
# any other string: call that tool.
ToolChoice = Literal["auto", "none", "required"] | str


@dataclass(frozen=True)
class ToolCallFormat:
    name: str
    call_open: str
    call_close: str
    call_separator: str
    response_open: str
    response_close: str

    # ----------------------------------------------------------- the grammar

    def grammar(
        self,
        specs: Sequence[ToolSpec],
        choice: ToolChoice = "auto",
        *,
        parallel: bool = True,
        answer_schema: dict[str, Any] | None = None,
    ) -> str | None:
        """The Lark grammar a turn is decoded under, or None for an unconstrained
        turn (`none`: a plain answer). `auto` takes an answer that never opens a
        call block, one or more calls, or text then calls (as Qwen writes "Let me
        look." before a call); with `answer_schema`, a JSON answer or calls.
        `required` takes one or more calls; a tool's name, exactly one call of
        it. Without `parallel`, at most one call."""
        if choice == "none":
            return None
        if choice not in ("auto", "required"):
            specs = [s for s in specs if s.name == choice]
            if not specs:
                raise UsageError(f"tool_choice names {choice!r}, which is not one of the tools")
            parallel = False
        if not specs:
            raise UsageError("a tool call needs at least one tool")
        opening = self.call_open.strip()
        assert self.call_open.startswith(opening), "a call block opens with its tag"
        call_rules = [f"call_{i}: %json{json.dumps(_call_schema(s))}" for i, s in enumerate(specs)]
        more = " more" if parallel else ""  # (the calls after a first one)
        lines = [
            f"calls: call{more}",
            f"call: {_lark_string(opening)} opened",
            # (a call past its opening tag: where text before the calls stops, below)
            f"opened: {_lark_string(self.call_open[len(opening) :])} ({' | '.join(f'call_{i}' for i in range(len(specs)))}) "
            + _lark_string(self.call_close),
            *([f"more: ({_lark_string(self.call_separator)} call)*"] if parallel else []),
            *call_rules,
        ]
        if choice == "auto" and answer_schema is not None:
            lines = ["start: answer | calls", f"answer: %json{json.dumps(answer_schema)}", *lines]
        elif choice == "auto":
            # An answer may say anything but the call block's opening: a call is only
            # ever made through the rules below, so it always names a real tool.
            # Text before calls ends lazily at the opening (llguidance's `stop`): a
            # greedy lexeme would swallow a prefix of it and never give it back.
            lines = [
                f"start: ANSWER | calls | text opened{more}",
                f"ANSWER: /(?s:.+)/ & ~/(?s:.*{re.escape(opening)}.*)/",
                f"text[stop={_lark_string(opening)}]: /(?s:.*)/",
                *lines,
            ]
        else:
            lines = ["start: calls", *lines]
        return "\n".join(lines) + "\n"

    # ------------------------------------------------------------ reading

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """The answer text and the calls in a model's output. Blocks that do not
        parse as a call (an unconstrained model's attempt) stay in the text."""
        calls: list[ToolCall] = []
        pattern = re.escape(self.call_open.strip()) + r"\s*(.*?)\s*" + re.escape(self.call_close.strip())

        def take(match: re.Match[str]) -> str:
            call = read_call(match.group(1))
            if call is None:
                return match.group(0)
            calls.append(call)
            return ""

        rest = re.sub(pattern, take, text, flags=re.DOTALL)
        if not calls:
            return text, calls
        # A block left open after whole calls is one the turn ran out of tokens in.
        return rest.split(self.call_open.strip())[0].strip(), calls

    # ------------------------------------------------------------ writing

    def render_call(self, name: str, arguments: str) -> str:
        return f'{self.call_open}{{"name": {json.dumps(name)}, "arguments": {arguments}}}{self.call_close}'

    def fold(self, messages: Sequence[Mapping[str, Any]], specs: Sequence[ToolSpec]) -> list[dict[str, str]]:
        """The conversation as plain role/content messages, for a chat template
        that knows no tools: the tools in the system message, each assistant's
        calls as its text, each run of tool results as one user message."""
        out: list[dict[str, str]] = []
        if specs:
            tools_text = self.tools_prompt(specs)
            if messages and messages[0].get("role") == "system":
                out.append({"role": "system", "content": f"{messages[0].get('content') or ''}\n\n{tools_text}"})
                messages = messages[1:]
            else:
                out.append({"role": "system", "content": f"You are a helpful assistant.\n\n{tools_text}"})
        previous = None
        for m in messages:
            role, content = m.get("role"), m.get("content") or ""
            if role == "assistant" and m.get("tool_calls"):
                blocks = [self.render_call(*_name_and_arguments(c)) for c in m["tool_calls"]]
                out.append({"role": "assistant", "content": self.call_separator.join(([content] if content else []) + blocks)})
            elif role == "tool":
                block = f"{self.response_open}{content}{self.response_close}"
                if previous == "tool":  # a run of results is one user turn, as Qwen's template writes it
                    out[-1]["content"] += "\n" + block
                else:
                    out.append({"role": "user", "content": block})
            else:
                out.append({"role": str(role), "content": str(content)})
            previous = role
        return out

    def tools_prompt(self, specs: Sequence[ToolSpec]) -> str:
        """How Qwen2.5's template introduces the tools, word for word."""
        listing = "\n".join(json.dumps(s.as_openai(), ensure_ascii=False) for s in specs)
        return (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{listing}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
            '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        )


HERMES = ToolCallFormat(
    name="hermes",
    call_open="<tool_call>\n",
    call_close="\n</tool_call>",
    call_separator="\n",
    response_open="<tool_response>\n",
    response_close="\n</tool_response>",
)


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as Hugging Face templates take it: a call's arguments an
    object, not the JSON text OpenAI sends."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {"type": "function", "function": {"name": name, "arguments": _arguments_object(arguments)}}
                for name, arguments in map(_name_and_arguments, m["tool_calls"])
            ]
            m.setdefault("content", "")
            if m["content"] is None:
                m["content"] = ""
        out.append(m)
    return out


def _name_and_arguments(call: Any) -> tuple[str, str]:
    """(name, arguments as JSON text) of a ToolCall or an OpenAI call dict."""
    if isinstance(call, ToolCall):
        return call.name, call.arguments
    function = call.get("function", call) if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise UsageError(f"a tool call is a ToolCall or {{'function': {{'name': ..., 'arguments': ...}}}}, got {str(call)[:60]}")
    arguments = function.get("arguments", "{}")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    _arguments_object(arguments)
    return function["name"], arguments


def _arguments_object(arguments: str) -> dict[str, Any]:
    """A call's arguments, from the JSON text of an object (a conversation's own
    calls: written by hand, or by a client, they may be anything)."""
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict):
        raise UsageError(f"a tool call's arguments must be the JSON text of an object, got {arguments[:60]!r}")
    return value


def read_call(body: str) -> ToolCall | None:
    try:
        raw = json.loads(body)
    except ValueError:
        return None
    if not (isinstance(raw, dict) and isinstance(raw.get("name"), str) and isinstance(raw.get("arguments", {}), dict)):
        return None
    return ToolCall(new_call_id(), raw["name"], json.dumps(raw.get("arguments", {}), ensure_ascii=False))


def _call_schema(spec: ToolSpec) -> dict[str, Any]:
    """One call as a JSON object: `name` first (the order is kept), then the
    arguments; the parameters' `$defs` lifted to the root, where their `$ref`s
    point once the parameters sit one level down."""
    parameters = dict(spec.parameters)
    lifted = {key: parameters.pop(key) for key in ("$defs", "definitions") if key in parameters}
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {"name": {"const": spec.name}, "arguments": parameters},
        "required": ["name", "arguments"],
        "additionalProperties": False,
        # Written as json.dumps writes it (and Qwen's template renders calls): no
        # room for a noisy model to pad a call with whitespace until it runs out.
        "x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "},
    }
    schema.update(lifted)
    return schema


def _lark_string(text: str) -> str:
    return json.dumps(text)
