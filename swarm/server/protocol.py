"""The OpenAI wire format: request bodies in, validated; responses and chunks out.

A request body is decoded straight into a Struct that forbids unknown fields, so
a parameter slotswarm does not implement is a 400 naming it, never silently
ignored. A few OpenAI parameters are accepted only at the value that means "off"
(`n: 1`, `frequency_penalty: 0`, `logprobs: false`...), since clients send them.
"""

from __future__ import annotations

import re
import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from runtime.errors import RequestError
from runtime.scheduling.priority import BACKGROUND, FOREGROUND
from runtime.scheduling.work import GREEDY, Sampling
from swarm.server.calls import MessageToolCall, NamedToolChoice, ResponseFormat, ToolDef, ToolPlan, message_calls, plan_tools

MAX_STOPS = 4
PRIORITY_RANGE = 1_000_000  # |priority| above this is surely a mistake
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/+-]{0,63}")


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # usage in every chunk (vLLM's extension)


class Message(msgspec.Struct, forbid_unknown_fields=True):
    role: str
    content: str | list[Any] | None = None
    name: str | None = None  # passed on to the chat template, which may show it
    tool_calls: list[MessageToolCall] | None = None  # an assistant's calls
    tool_call_id: str | None = None  # a tool message: the call it answers


class _Request(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    user: str | None = None
    priority: int | None = None
    ignore_eos: bool = False
    # Accepted only switched off.
    frequency_penalty: float | None = None
    presence_penalty: float | None = None


class ChatRequest(_Request):
    messages: list[Message]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    # Tool calls and structured output: swarm.server.calls.
    tools: list[ToolDef] | None = None
    tool_choice: str | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None


class CompletionRequest(_Request):
    prompt: str | list[Any]
    echo: bool = False
    best_of: int | None = None
    logprobs: int | None = None
    suffix: str | None = None


@dataclass
class TurnSpec:
    """What a request asks of the swarm, once validated; the prompt still as text
    (or token ids) until the gateway applies the chat template."""

    kind: Literal["chat", "text"]
    model: str
    messages: list[dict[str, Any]] | None = None
    text: str | None = None
    token_ids: list[int] | None = None
    max_tokens: int | None = None
    sampling: Sampling = GREEDY
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    priority: int | None = None
    user: str | None = None
    tools: ToolPlan = field(default_factory=ToolPlan)  # tools and the answer's format


# ------------------------------------------------------------------- requests


def parse_chat(body: bytes) -> TurnSpec:
    req = _decode(body, ChatRequest)
    if req.logprobs or req.top_logprobs:
        raise _unsupported("logprobs")
    if not req.messages:
        raise RequestError("`messages` must hold at least one message", param="messages")
    messages = [_message(i, m) for i, m in enumerate(req.messages)]
    _check_tool_answers(messages)
    if req.max_tokens is not None and req.max_completion_tokens is not None and req.max_tokens != req.max_completion_tokens:
        raise RequestError("`max_tokens` and `max_completion_tokens` disagree; send one", param="max_tokens")
    spec = _common(req, "chat", req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens)
    spec.messages = messages
    spec.tools = plan_tools(req.tools, req.tool_choice, req.parallel_tool_calls, req.response_format)
    return spec


def parse_completion(body: bytes) -> TurnSpec:
    req = _decode(body, CompletionRequest)
    if req.echo:
        raise _unsupported("echo")
    if req.suffix:
        raise _unsupported("suffix")
    if req.logprobs:
        raise _unsupported("logprobs")
    if req.best_of not in (None, 1):
        raise RequestError("only `best_of: 1` is supported", param="best_of", code="unsupported_parameter")
    spec = _common(req, "text", req.max_tokens)
    prompt = req.prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        spec.text = prompt
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        spec.token_ids = list(prompt)
    else:
        raise RequestError("`prompt` must be a string or a list of token ids (one prompt per request)", param="prompt")
    return spec


def parse_priority(header: str | None) -> int | None:
    """The X-Swarm-Priority header: foreground, background or an integer."""
    if header is None:
        return None
    word = header.strip().lower()
    if word == "foreground":
        return FOREGROUND
    if word == "background":
        return BACKGROUND
    try:
        value = int(word)
    except ValueError:
        raise RequestError(
            f"X-Swarm-Priority must be foreground, background or an integer, got {header!r}",
            param="X-Swarm-Priority",
            code="invalid_priority",
        ) from None
    return check_priority(value, "X-Swarm-Priority")


def check_priority(value: int, param: str) -> int:
    if not -PRIORITY_RANGE <= value <= PRIORITY_RANGE:
        raise RequestError(
            f"{param} must be between {-PRIORITY_RANGE} and {PRIORITY_RANGE}, got {value}", param=param, code="invalid_priority"
        )
    return value


def check_agent_name(name: str, param: str) -> str:
    if not _NAME.fullmatch(name):
        raise RequestError(
            f"{param} must be 1-64 characters of letters, digits and ._:@/+- (starting with a letter or digit), got {name!r}",
            param=param,
            code="invalid_agent",
        )
    return name


def _decode(body: bytes, kind: type[msgspec.Struct]) -> Any:
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        text = str(exc)
        unknown = re.search(r"unknown field `([^`]*)`", text)
        if unknown:
            raise _unsupported(unknown.group(1)) from None
        at = re.search(r"at `\$\.?([^`]*)`", text)
        param = at.group(1) if at and at.group(1) else None
        raise RequestError(f"invalid request body: {text}", param=param) from None
    except msgspec.DecodeError as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:
        raise RequestError("the request body nests JSON too deeply", code="invalid_json") from None


def _unsupported(name: str) -> RequestError:
    return RequestError(
        f"parameter `{name}` is not supported by slotswarm (it is never silently ignored); remove it from the request",
        param=name,
        code="unsupported_parameter",
    )


def _message(i: int, m: Message) -> dict[str, Any]:
    role = "system" if m.role == "developer" else m.role
    if role not in ("system", "user", "assistant", "tool"):
        raise RequestError(
            f"messages[{i}].role must be system, developer, user, assistant or tool, got {m.role!r}", param=f"messages[{i}].role"
        )
    if m.tool_calls is not None and role != "assistant":
        raise RequestError(f"messages[{i}]: only an assistant message has tool_calls", param=f"messages[{i}].tool_calls")
    if (role == "tool") != (m.tool_call_id is not None):
        raise RequestError(f"messages[{i}]: a tool message, and only one, needs tool_call_id", param=f"messages[{i}].tool_call_id")
    extra: dict[str, Any] = {}
    if m.name is not None:
        extra["name"] = m.name
    if m.tool_call_id is not None:
        extra["tool_call_id"] = m.tool_call_id
    if m.tool_calls:
        extra["tool_calls"] = message_calls(m.tool_calls)
        if m.content is None:
            return {"role": role, "content": None, **extra}
    if isinstance(m.content, str):
        return {"role": role, "content": m.content, **extra}
    if isinstance(m.content, list):
        texts = []
        for part in m.content:
            if not (
                isinstance(part, dict)
                and part.get("type") == "text"
                and isinstance(part.get("text"), str)
                and set(part) <= {"type", "text"}
            ):
                raise RequestError(
                    f"messages[{i}].content: only text parts ({{'type': 'text', 'text': ...}}) are supported",
                    param=f"messages[{i}].content",
                )
            texts.append(part["text"])
        return {"role": role, "content": "".join(texts), **extra}
    raise RequestError(f"messages[{i}].content must be a string or a list of text parts", param=f"messages[{i}].content")


def _check_tool_answers(messages: list[dict[str, Any]]) -> None:
    """A tool message answers a call an earlier assistant message made, as OpenAI
    requires: one that answers nothing is a client's bookkeeping gone wrong."""
    called: set[str] = set()
    for i, m in enumerate(messages):
        called.update(c["id"] for c in m.get("tool_calls") or ())
        if m["role"] == "tool" and m["tool_call_id"] not in called:
            raise RequestError(
                f"messages[{i}]: a tool message must answer a call of an earlier assistant message; no call has id {m['tool_call_id']!r}",
                param=f"messages[{i}].tool_call_id",
            )


def _common(req: _Request, kind: Literal["chat", "text"], max_tokens: int | None) -> TurnSpec:
    if req.n not in (None, 1):
        raise RequestError("only `n: 1` is supported: send one request per completion", param="n", code="unsupported_parameter")
    for name in ("frequency_penalty", "presence_penalty"):
        if getattr(req, name):
            raise _unsupported(name)
    if max_tokens is not None and max_tokens < 1:
        raise RequestError(f"`max_tokens` must be at least 1, got {max_tokens}", param="max_tokens")
    temperature = 1.0 if req.temperature is None else req.temperature  # OpenAI's default
    if not 0.0 <= temperature <= 2.0:
        raise RequestError(f"`temperature` must be between 0 and 2, got {temperature}", param="temperature")
    top_p = 1.0 if req.top_p is None else req.top_p
    if not 0.0 < top_p <= 1.0:
        raise RequestError(f"`top_p` must be in (0, 1], got {top_p}", param="top_p")
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stop) > MAX_STOPS or not all(stop):
        raise RequestError(f"`stop` takes at most {MAX_STOPS} non-empty strings", param="stop")
    if temperature == 0.0:
        sampling = GREEDY
    else:
        seed = req.seed if req.seed is not None else secrets.randbits(63)
        sampling = Sampling(temperature=temperature, top_p=top_p, seed=seed)
    options = req.stream_options or StreamOptions()
    if req.stream_options is not None and not req.stream:
        raise RequestError("`stream_options` needs `stream: true`", param="stream_options")
    return TurnSpec(
        kind=kind,
        model=req.model,
        max_tokens=max_tokens,
        sampling=sampling,
        stop=stop,
        ignore_eos=req.ignore_eos,
        stream=req.stream,
        include_usage=options.include_usage or options.continuous_usage_stats,
        continuous_usage=options.continuous_usage_stats,
        # vLLM's convention, so its clients work unchanged: lower values first, 0 by
        # default. Negated, it is slotswarm's (higher first, background 0).
        priority=None if req.priority is None else -check_priority(req.priority, "priority"),
        user=None if req.user is None else check_agent_name(req.user, "user"),
    )


# ------------------------------------------------------------------ responses

_encoder = msgspec.json.Encoder()


def encode(obj: Any) -> bytes:
    return _encoder.encode(obj)


def error_body(exc: RequestError) -> dict[str, Any]:
    return {"error": {"message": exc.message, "type": exc.type, "param": exc.param, "code": exc.code}}


def sse(obj: Any) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else _encoder.encode(obj)) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


class Reply:
    """Builds one request's response objects: the whole completion, or its chunks."""

    def __init__(self, kind: Literal["chat", "text"], model: str) -> None:
        self.kind = kind
        self.model = model
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def whole(self, text: str, finish_reason: str, usage: dict[str, Any], calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        if self.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text or None if calls else text}
            if calls:
                message["tool_calls"] = calls
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": [choice], "usage": usage}

    def chunk(
        self, text: str | None, finish_reason: str | None = None, usage: dict[str, Any] | None = None, *, first: bool = False
    ) -> dict[str, Any]:
        if self.kind == "chat":
            delta: dict[str, Any] = (
                {"role": "assistant", "content": text or ""} if first else ({"content": text} if text is not None else {})
            )
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
            obj = "text_completion"
        out = {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": [choice]}
        if usage is not None:
            out["usage"] = usage
        return out

    def calls_chunk(self, deltas: list[dict[str, Any]]) -> dict[str, Any]:
        """A chunk of tool-call deltas (swarm.server.calls.call_deltas)."""
        choice = {"index": 0, "delta": {"tool_calls": deltas}, "logprobs": None, "finish_reason": None}
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model, "choices": [choice]}

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": [], "usage": usage}
