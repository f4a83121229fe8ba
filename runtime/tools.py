"""Tools: plain typed Python callables an agent lets its model call.

    class Coder(Agent):
        @tool(timeout_s=30)
        async def read_file(self, path: str, first_line: int = 1) -> str:
            \"\"\"Read a file of the workspace.\"\"\"
            ...

        async def run(self) -> None:
            answer = await self.use_tools("What does main.py do?", tools=[self.read_file])

Any typed callable is a tool; `@tool` only names it, describes it or bounds its
time. The parameter schema the model sees comes from the type hints, through
msgspec's own JSON Schema generation, and the model's arguments are decoded by
msgspec against the very same types before the call, so a tool body never sees
an argument of the wrong type. The description is the docstring's first paragraph.

A tool never crashes its agent: what it raises, a timeout, arguments that do not
fit and a name no tool has all come back as an error text, which goes to the
model as the tool's result (`ToolOutcome`).
"""

from __future__ import annotations

import inspect
import re
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import anyio
import msgspec

from runtime.errors import UsageError

_MARK = "__slotswarm_tool__"


@dataclass(frozen=True)
class ToolSpec:
    """What the model is told about a tool: OpenAI's `function` object."""

    name: str
    description: str
    parameters: dict[str, Any]  # a JSON Schema of an object; `$defs` inside it

    def as_openai(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


@dataclass(frozen=True)
class _Options:
    name: str | None
    description: str | None
    timeout_s: float | None


def tool(fn: Callable | None = None, *, name: str | None = None, description: str | None = None, timeout_s: float | None = None) -> Any:
    """Mark a function or method as a tool: `@tool`, or `@tool(name=..., timeout_s=...)`.
    The function itself is returned unchanged (still callable as before)."""

    def mark(f: Callable) -> Callable:
        if timeout_s is not None and not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise UsageError(f"tool {getattr(f, '__name__', f)!r}: timeout_s must be a number > 0, got {timeout_s!r}")
        setattr(f, _MARK, _Options(name, description, timeout_s))
        return f

    return mark(fn) if fn is not None else mark


_TOOL_NAME = "^[A-Za-z0-9_-]{1,64}$"  # OpenAI's rule for function names


class Tool:
    """A callable with its spec and its argument type. Build one with `Tool.of(fn)`."""

    def __init__(self, fn: Callable, spec: ToolSpec, arguments: type[msgspec.Struct], timeout_s: float | None) -> None:
        self.fn = fn
        self.spec = spec
        self.arguments = arguments
        self.timeout_s = timeout_s

    @property
    def name(self) -> str:
        return self.spec.name

    @classmethod
    def of(cls, fn: Callable | Tool) -> Tool:
        """The tool for a callable (a function, a bound method, a `@tool`)."""
        if isinstance(fn, Tool):
            return fn
        if not callable(fn):
            raise UsageError(f"a tool is a callable, not {type(fn).__name__}")
        options: _Options = getattr(fn, _MARK, None) or _Options(None, None, None)
        name = options.name or getattr(fn, "__name__", None)
        if not isinstance(name, str) or not re.fullmatch(_TOOL_NAME, name):
            raise UsageError(f"tool name {name!r}: use 1-64 letters, digits, '_' or '-'")
        arguments = _arguments_type(fn, name)
        description = options.description if options.description is not None else _first_paragraph(inspect.getdoc(fn))
        return cls(fn, ToolSpec(name, description, _parameters_schema(arguments)), arguments, options.timeout_s)

    async def run(self, arguments: str | bytes, *, timeout_s: float | None = None) -> ToolOutcome:
        """Call the tool with the model's JSON arguments. Never raises for what the
        tool or the model did wrong: that is the outcome's error text."""
        started = time.perf_counter()
        limit = self.timeout_s if self.timeout_s is not None else timeout_s

        def outcome(status: Literal["ok", "error", "timeout"], text: str) -> ToolOutcome:
            return ToolOutcome(self.name, status, text, time.perf_counter() - started)

        try:
            args = msgspec.json.decode(arguments or b"{}", type=self.arguments)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return outcome("error", f"error: invalid arguments for {self.name}: {exc}")
        kwargs = msgspec.structs.asdict(args)
        try:
            with anyio.fail_after(limit):
                if inspect.iscoroutinefunction(self.fn) or inspect.iscoroutinefunction(self.fn.__call__):
                    result = await self.fn(**kwargs)
                else:  # plain code may block: off the event loop
                    result = await anyio.to_thread.run_sync(lambda: self.fn(**kwargs), abandon_on_cancel=True)
        except TimeoutError:
            return outcome("timeout", f"error: {self.name} timed out after {limit:g} s")
        except Exception as exc:  # the tool's own failure goes back to the model
            return outcome("error", f"error: {self.name} raised {type(exc).__name__}: {exc}")
        return outcome("ok", result if isinstance(result, str) else msgspec.json.encode(result).decode())


@dataclass(frozen=True)
class ToolOutcome:
    """One call's end: what goes back to the model as the tool's result, and for the event."""

    name: str
    status: Literal["ok", "error", "timeout", "unknown"]
    text: str
    duration_s: float


def unknown_tool(name: str, known: list[str]) -> ToolOutcome:
    """The outcome of a call to a name no tool has (one written into a
    conversation by hand: constrained decoding never emits one)."""
    return ToolOutcome(name, "unknown", f"error: there is no tool named {name!r}; the tools are: {', '.join(known) or 'none'}", 0.0)


def tools_by_name(tools: list[Callable | Tool]) -> dict[str, Tool]:
    if not isinstance(tools, (list, tuple)) or not tools:
        raise UsageError("tools must be a non-empty list of callables")
    found: dict[str, Tool] = {}
    for fn in tools:
        t = Tool.of(fn)
        if t.name in found:
            raise UsageError(f"two tools are named {t.name!r}")
        found[t.name] = t
    return found


def _arguments_type(fn: Callable, name: str) -> type[msgspec.Struct]:
    """A Struct with a field per parameter, typed by its hint: what msgspec
    writes the schema from and decodes the model's arguments into."""
    try:
        signature = inspect.signature(fn)
        hints = typing.get_type_hints(fn, include_extras=True)  # Annotated constraints are schema too
    except (TypeError, ValueError, NameError) as exc:
        raise UsageError(f"tool {name!r}: cannot read its signature ({exc})") from None
    fields: list[tuple[Any, ...]] = []
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise UsageError(f"tool {name!r}: parameter {param.name!r} must be passable by keyword (no *args, **kwargs or positional-only)")
        if param.name not in hints:
            raise UsageError(f"tool {name!r}: parameter {param.name!r} needs a type hint (its schema comes from it)")
        if param.default is param.empty:
            fields.append((param.name, hints[param.name]))
        else:
            fields.append((param.name, hints[param.name], param.default))
    try:
        kind = msgspec.defstruct(f"{name}_arguments", fields, kw_only=True, forbid_unknown_fields=True)
        msgspec.json.schema(kind)  # a hint msgspec cannot describe fails here, not at the first call
    except (TypeError, ValueError) as exc:
        raise UsageError(f"tool {name!r}: its type hints have no JSON Schema ({exc})") from None
    return kind


def struct_schema(kind: Any) -> dict[str, Any]:
    """msgspec's JSON Schema for a type, with its definitions under `$defs` of
    the schema itself (one self-contained object, as tool parameters and
    response formats want), not behind a top-level `$ref`."""
    (top,), components = msgspec.json.schema_components([kind], ref_template="#/$defs/{name}")
    ref = top.get("$ref", "")
    if not (ref.startswith("#/$defs/") and len(top) == 1):
        return dict(top, **({"$defs": components} if components else {}))
    name = ref.removeprefix("#/$defs/")
    schema = dict(components[name])
    others = {k: v for k, v in components.items() if k != name}
    if ref.encode() in msgspec.json.encode(list(components.values())):
        others = components  # a recursive type refers to itself
    if others:
        schema["$defs"] = others
    return schema


def _parameters_schema(arguments: type[msgspec.Struct]) -> dict[str, Any]:
    schema = struct_schema(arguments)
    schema.pop("title", None)  # the made-up struct's name says nothing to the model
    schema.setdefault("properties", {})
    schema["additionalProperties"] = False
    return schema


def _first_paragraph(doc: str | None) -> str:
    return (doc or "").strip().split("\n\n")[0].replace("\n", " ")
