"""Tool calls and structured output over the OpenAI API.

In: a chat request's `tools`, `tool_choice`, `parallel_tool_calls` and
`response_format` become one constraint on the turn (runtime.toolcalls writes
the grammar: a call always parses and names a real tool; a `json_schema`
answer always validates). A schema the grammar engine cannot follow is a 400
naming what it lacks, raised when the turn is checked, before it is queued.

Out: the model's text is split back into content and tool calls, whole or as it
streams (`CallSplitter`): a call goes out as soon as its block closes, in
OpenAI's two deltas (id, type and name with empty arguments, then the
arguments), and a turn that made calls finishes with "tool_calls".
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import msgspec

from runtime.errors import RequestError
from runtime.scheduling.constraints import Constraint, Grammar, JsonSchema
from runtime.toolcalls import ToolCall, ToolCallFormat, ToolChoice, read_call
from runtime.tools import ToolSpec

MAX_TOOLS = 128  # OpenAI's own bound
_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_EMPTY_PARAMETERS = {"type": "object", "properties": {}}


class FunctionDef(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # every call is held to the schema, strict or not


class ToolDef(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    function: FunctionDef


class NamedFunction(msgspec.Struct, forbid_unknown_fields=True):
    name: str


class NamedToolChoice(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    function: NamedFunction


class JsonSchemaFormat(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None  # the answer is held to the schema, strict or not


class ResponseFormat(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    json_schema: JsonSchemaFormat | None = None


class FunctionCall(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    arguments: str


class MessageToolCall(msgspec.Struct, forbid_unknown_fields=True):
    id: str
    function: FunctionCall
    type: str = "function"


@dataclass
class ToolPlan:
    """What a request asks of the turn's output, validated."""

    tools: list[ToolSpec] = field(default_factory=list)
    choice: ToolChoice = "auto"
    parallel: bool = True
    answer_schema: dict[str, Any] | None = None  # response_format's, if JSON

    @property
    def may_call(self) -> bool:
        return bool(self.tools) and self.choice != "none"

    def constraint(self, fmt: ToolCallFormat) -> Constraint | None:
        if self.may_call:
            return Grammar(fmt.grammar(self.tools, self.choice, parallel=self.parallel, answer_schema=self.answer_schema))
        if self.answer_schema is not None:
            return JsonSchema(json.dumps(self.answer_schema))
        return None


def plan_tools(
    tools: list[ToolDef] | None,
    tool_choice: str | NamedToolChoice | None,
    parallel: bool | None,
    response_format: ResponseFormat | None,
) -> ToolPlan:
    """The request's tool and format parameters, checked (a 400 naming the parameter)."""
    plan = ToolPlan()
    if tools is not None:
        if not tools:
            raise RequestError("`tools` must hold at least one tool (leave it out for none)", param="tools")
        if len(tools) > MAX_TOOLS:
            raise RequestError(f"`tools` holds {len(tools)} tools; at most {MAX_TOOLS} are taken, as by OpenAI", param="tools")
        seen: set[str] = set()
        for i, t in enumerate(tools):
            if t.type != "function":
                raise RequestError(f"tools[{i}].type must be 'function', got {t.type!r}", param=f"tools[{i}].type")
            name = t.function.name
            if not _FUNCTION_NAME.fullmatch(name):
                raise RequestError(
                    f"tools[{i}].function.name must be 1-64 letters, digits, '_' or '-', got {name!r}", param=f"tools[{i}].function.name"
                )
            if name in seen:
                raise RequestError(f"two tools are named {name!r}", param=f"tools[{i}].function.name")
            seen.add(name)
            parameters = t.function.parameters if t.function.parameters is not None else _EMPTY_PARAMETERS
            if parameters.get("type", "object") != "object":
                raise RequestError(
                    f"tools[{i}].function.parameters must be a JSON Schema of an object", param=f"tools[{i}].function.parameters"
                )
            plan.tools.append(ToolSpec(name, t.function.description or "", parameters))
    if tool_choice is not None:
        if not plan.tools:
            raise RequestError("`tool_choice` needs `tools`", param="tool_choice")
        if isinstance(tool_choice, NamedToolChoice):
            if tool_choice.type != "function":
                raise RequestError(f"tool_choice.type must be 'function', got {tool_choice.type!r}", param="tool_choice.type")
            if tool_choice.function.name not in seen:
                raise RequestError(f"tool_choice names {tool_choice.function.name!r}, which is not one of the tools", param="tool_choice")
            plan.choice = tool_choice.function.name
        elif tool_choice in ("auto", "none", "required"):
            plan.choice = tool_choice
        else:
            raise RequestError(f"`tool_choice` must be auto, none, required or a named function, got {tool_choice!r}", param="tool_choice")
    if parallel is not None:
        if not plan.tools:
            raise RequestError("`parallel_tool_calls` needs `tools`", param="parallel_tool_calls")
        plan.parallel = parallel
    if response_format is not None:
        kind = response_format.type
        if kind == "json_object":
            plan.answer_schema = {"type": "object"}
        elif kind == "json_schema":
            spec = response_format.json_schema
            if spec is None or spec.schema is None:
                raise RequestError("response_format json_schema needs `json_schema.schema`", param="response_format.json_schema")
            plan.answer_schema = spec.schema
        elif kind != "text":
            raise RequestError(f"response_format.type must be text, json_object or json_schema, got {kind!r}", param="response_format.type")
    return plan


def message_calls(calls: list[MessageToolCall]) -> list[dict[str, Any]]:
    """An assistant message's calls, as OpenAI dicts (for the chat template)."""
    return [{"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}} for c in calls]


class CallSplitter:
    """Splits a streamed answer into content and tool calls. The grammar makes an
    answer text, call blocks, or text then call blocks (runtime.toolcalls): text
    goes out as it comes, but for a tail that may still open the first block (a
    prefix of its opening tag, and the white space before it), held until the
    next piece says; from the opening on, each call goes out as its block closes."""

    def __init__(self, fmt: ToolCallFormat) -> None:
        self.fmt = fmt
        self.calls: list[ToolCall] = []
        self._in_calls = False  # the first block has opened
        self._held = ""
        self._opening = fmt.call_open.strip()
        self._close = fmt.call_close.strip()

    def push(self, piece: str) -> list[str | ToolCall]:
        """What can go out now: text pieces and whole calls."""
        self._held += piece
        if self._in_calls:
            return self._take_calls()
        at = self._held.find(self._opening)
        if at < 0:
            return self._take_text()
        # (the text before the calls, as ToolCallFormat.parse reads it: without the blank before the block)
        text, self._held = self._held[:at].rstrip(), self._held[at:]
        self._in_calls = True
        return ([text] if text else []) + self._take_calls()

    def finish(self) -> list[str | ToolCall]:
        """What is left at the turn's end. A call block the turn ran out of tokens
        in is dropped after whole calls (as `ToolCallFormat.parse` does), and sent
        as the text the model wrote when it is all there is."""
        out: list[str | ToolCall] = self._take_calls() if self._in_calls else []
        if self._held and not self.calls:
            out.append(self._held)
        self._held = ""
        return out

    def _take_text(self) -> list[str]:
        """The held text but its tail that may still open a call block."""
        held, opening = self._held, self._opening
        tail = next((n for n in range(min(len(opening) - 1, len(held)), 0, -1) if opening.startswith(held[-n:])), 0)
        cut = len(held[: len(held) - tail].rstrip())
        out, self._held = held[:cut], held[cut:]
        return [out] if out else []

    def _take_calls(self) -> list[str | ToolCall]:
        out: list[str | ToolCall] = []
        opening = self._opening
        while (end := self._held.find(self._close)) >= 0:
            block, self._held = self._held[: end + len(self._close)], self._held[end + len(self._close) :]
            body = block.strip().removeprefix(opening).removesuffix(self._close)
            call = read_call(body.strip())
            if call is None:  # not a call after all (an unconstrained turn): text
                out.append(block)
                continue
            self.calls.append(call)
            out.append(call)
        return out


def call_deltas(index: int, call: ToolCall) -> list[dict[str, Any]]:
    """A call as OpenAI streams it: its id, type and name first, then its arguments."""
    return [
        {"index": index, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}},
        {"index": index, "function": {"arguments": call.arguments}},
    ]
