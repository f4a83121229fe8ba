"""The Starlette app: routes, auth and errors. The turn logic is the gateway's.

    POST /v1/chat/completions   POST /v1/completions   (stream or not; JSON bodies only)
    GET  /v1/models[/ID]        GET  /v1/events        (server-sent events)
    GET  /health                GET  /metrics

With an API key, every path but /health needs it (`_Guard`). The Host header must
name the address served (`swarm.viewers.watch.trusted_hosts`), against DNS rebinding.

Every error is an OpenAI error object, `{"error": {"message", "type", "param",
"code"}}`. A request runs inside a response that listens for the client hanging
up: a hang-up cancels the turn at the next token boundary, queued or paused alike.
More routes (a page at `/`) come in through `build_app(..., routes=[...])`.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from runtime.errors import RequestError
from runtime.events.bus import Subscription
from runtime.events.stream import CLIENT_BUFFER, encode_line
from runtime.toolcalls import ToolCall
from swarm.server.calls import CallSplitter, call_deltas
from swarm.server.gateway import Gateway
from swarm.server.metrics import CONTENT_TYPE, Metrics
from swarm.server.protocol import SSE_DONE, Reply, TurnSpec, encode, error_body, parse_chat, parse_completion, sse
from swarm.server.turn import ServedTurn
from swarm.viewers.watch import trusted_hosts

MAX_BODY = 4 * 1024 * 1024
EVENTS_PING_S = 15.0
SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
JSON = [(b"content-type", b"application/json")]
SERVED = "POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /v1/events, GET /health, GET /metrics and the live page at /"


def build_app(
    gateway: Gateway, metrics: Metrics, *, api_key: str | None = None, host: str = "127.0.0.1", routes: Sequence[BaseRoute] = ()
) -> Starlette:
    """The app; `routes` are served next to the API (a page at `/`, say). `host`
    is the address it listens on, which the Host header must name."""
    api = _Api(gateway, metrics)
    app = Starlette(
        routes=[
            *routes,
            Route("/v1/chat/completions", api.chat, methods=["POST"]),
            Route("/v1/completions", api.completion, methods=["POST"]),
            Route("/v1/models", api.models, methods=["GET"]),
            Route("/v1/models/{model_id:path}", api.model, methods=["GET"]),
            Route("/v1/events", api.events, methods=["GET"]),
            Route("/health", api.health, methods=["GET"]),
            Route("/metrics", api.metrics, methods=["GET"]),
        ],
        exception_handlers={RequestError: _request_error, HTTPException: _http_error, Exception: _server_error},
        middleware=[Middleware(_CountResponses, metrics=metrics), trusted_hosts(host), Middleware(_Guard, api_key=api_key)],
    )
    app.state.gateway = gateway
    app.state.metrics = metrics
    return app


class _Api:
    def __init__(self, gateway: Gateway, metrics: Metrics) -> None:
        self.gateway = gateway
        self.metrics_ = metrics

    async def chat(self, request: Request) -> Response:
        return await self._complete(request, parse_chat)

    async def completion(self, request: Request) -> Response:
        return await self._complete(request, parse_completion)

    async def _complete(self, request: Request, parse: Callable[[bytes], TurnSpec]) -> Response:
        arrived = self.gateway.clock()
        _check_json(request)
        # In a worker thread: decoding scales with the body, and this loop drives the GPU owner.
        spec = await anyio.to_thread.run_sync(parse, await _read_body(request), limiter=self.gateway.workers)
        if spec.model != self.gateway.model_id:
            raise RequestError(
                f"model {spec.model!r} does not exist; this server has {self.gateway.model_id!r}",
                status=404,
                param="model",
                code="model_not_found",
            )
        caller = self.gateway.caller(request.headers, spec, request.client and (request.client.host, request.client.port))
        turn = self.gateway.turn(caller, spec, arrived)

        async def run(out: _Out) -> None:
            try:
                async with turn as served:
                    out.served = served
                    if spec.stream:
                        await _stream(out, served)
                    else:
                        await _whole(out, served)
            except RequestError as exc:
                if not out.started:
                    await out.start(exc.status, JSON, _error_headers(exc))
                    await out.body(encode(error_body(exc)), more=False)
                elif spec.stream:  # mid-stream: the openai client raises on an error event
                    await out.body(sse(error_body(exc)) + SSE_DONE, more=False)

        return _Watched(run)

    async def models(self, request: Request) -> Response:
        return _json({"object": "list", "data": [self._model()]})

    async def model(self, request: Request) -> Response:
        model_id = request.path_params["model_id"]
        if model_id != self.gateway.model_id:
            raise RequestError(
                f"model {model_id!r} does not exist; this server has {self.gateway.model_id!r}",
                status=404,
                param="model",
                code="model_not_found",
            )
        return _json(self._model())

    def _model(self) -> dict[str, Any]:
        return {"id": self.gateway.model_id, "object": "model", "created": 0, "owned_by": "slotswarm"}

    async def health(self, request: Request) -> Response:
        status = "shutting_down" if self.gateway.closing else "ok"
        return _json({"status": status, "turns": len(self.gateway.turns)}, 503 if self.gateway.closing else 200)

    async def metrics(self, request: Request) -> Response:
        return Response(self.metrics_.render(), headers={"content-type": CONTENT_TYPE})

    async def events(self, request: Request) -> Response:
        """The swarm's events, one JSON object per `data:` line, as in `swarm tail --json`."""
        bus, closed = self.gateway.swarm.bus, self.gateway.closed

        async def run(out: _Out) -> None:
            subscription = bus.subscribe(CLIENT_BUFFER)
            try:
                await out.start(200, SSE_HEADERS)
                if bus.last_started is not None:
                    await out.body(sse(encode_line(bus.last_started).rstrip()))
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_close_when, closed, subscription)  # the server has drained: end after what is buffered
                    while True:
                        with anyio.move_on_after(EVENTS_PING_S) as idle:
                            try:
                                item = await subscription.__anext__()
                            except StopAsyncIteration:
                                break  # the bus closed: the swarm stopped
                        if idle.cancelled_caught:
                            await out.body(b": ping\n\n")
                        else:
                            await out.body(sse(encode_line(item).rstrip()))  # an Event, or the events.dropped notice
                    tg.cancel_scope.cancel()
            finally:
                subscription.close()
            await out.body(b"", more=False)

        return _Watched(run)


async def _stream(out: _Out, served: ServedTurn) -> None:
    reply = Reply(served.spec.kind, served.gateway.model_id)
    spec = served.spec
    await out.start(200, SSE_HEADERS)
    if spec.kind == "chat":
        await out.body(sse(reply.chunk("", first=True)))
    splitter = CallSplitter(served.gateway.tokenizer.tool_format) if spec.tools.may_call else None

    async def send(items: list[str | ToolCall]) -> None:
        for item in items:
            if isinstance(item, ToolCall):  # two chunks, as OpenAI sends a call
                for delta in call_deltas(splitter.calls.index(item), item):
                    await out.body(sse(reply.calls_chunk([delta])))
            elif item:
                await out.body(sse(reply.chunk(item, usage=served.usage() if spec.continuous_usage else None)))

    async for text in served:
        await send([text] if splitter is None else splitter.push(text))
    if splitter is not None:
        await send(splitter.finish())
    usage = served.usage()
    finish_reason = "tool_calls" if splitter is not None and splitter.calls and served.finish_reason == "stop" else served.finish_reason
    await out.body(sse(reply.chunk(None, finish_reason, usage if spec.continuous_usage else None)))
    if spec.include_usage:
        await out.body(sse(reply.usage_chunk(usage)))
    await out.body(SSE_DONE, more=False)


async def _whole(out: _Out, served: ServedTurn) -> None:
    reply = Reply(served.spec.kind, served.gateway.model_id)
    text = "".join([piece async for piece in served])
    finish_reason = served.finish_reason or "stop"
    calls = None
    if served.spec.tools.may_call:
        text, found = served.gateway.tokenizer.tool_format.parse(text)
        calls = [c.as_openai() for c in found]
        if calls and finish_reason == "stop":
            finish_reason = "tool_calls"
    body = reply.whole(text, finish_reason, served.usage(), calls)
    await out.start(200, JSON)
    await out.body(encode(body), more=False)


async def _close_when(event: anyio.Event, subscription: Subscription) -> None:
    await event.wait()
    subscription.close()


class _Out:
    """The response's send side; notes whether headers went out and whether the
    client is gone (so the turn's cancel reason says so)."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = False
        self.gone = False
        self.served: ServedTurn | None = None

    async def start(self, status: int, headers: list[tuple[bytes, bytes]], extra: dict[str, str] | None = None) -> None:
        headers = headers + [(k.lower().encode(), v.encode()) for k, v in (extra or {}).items()]
        await self._call({"type": "http.response.start", "status": status, "headers": headers})
        self.started = True

    async def body(self, data: bytes, *, more: bool = True) -> None:
        await self._call({"type": "http.response.body", "body": data, "more_body": more})

    async def _call(self, message: dict[str, Any]) -> None:
        try:
            await self._send(message)
        except OSError:
            self.hang_up()
            raise

    def hang_up(self) -> None:
        self.gone = True
        if self.served is not None:
            self.served.handle.cancel_reason = "client disconnected"


class _Watched(Response):
    """Runs `run(out)` while listening for the client to hang up; a hang-up
    cancels it, and with it the turn (at the next token boundary)."""

    def __init__(self, run: Callable[[_Out], Awaitable[None]]) -> None:
        self.run = run
        self.status_code = 200  # what it starts with unless run() says otherwise
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        out = _Out(send)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch, receive, out, tg.cancel_scope)
                await self.run(out)
                tg.cancel_scope.cancel()
        except OSError:
            pass  # the client went away while we wrote: its turn is already cancelled

    @staticmethod
    async def _watch(receive: Receive, out: _Out, scope: anyio.CancelScope) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        out.hang_up()
        scope.cancel()


class _CountResponses:
    """Counts every response by path (the API's own, else "other") and status."""

    PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/events", "/health", "/metrics"})

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"] if scope["path"] in self.PATHS else "other"

        async def counted(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                self.metrics.responses.labels(path, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counted)


class _Guard:
    """With an API key, every path but /health needs `Authorization: Bearer KEY`.
    A browser cannot send that header for the live page and its event stream, so
    `/?key=KEY` sets a cookie (HttpOnly, SameSite=Strict, a digest of the key, not
    the key) and sends the browser on to `/`; the page's own GETs carry it."""

    OPEN = frozenset({"/health"})
    COOKIE = "swarm_page"

    def __init__(self, app: ASGIApp, api_key: str | None) -> None:
        self.app = app
        self.api_key = api_key
        self.page_token = None if api_key is None else hmac.new(api_key.encode(), b"swarm serve page", hashlib.sha256).hexdigest()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.api_key is None or scope["type"] != "http" or scope["path"] in self.OPEN:
            return await self.app(scope, receive, send)
        request = Request(scope)
        if self._bearer_ok(request) or (_is_page(request) and self._cookie_ok(request)):
            return await self.app(scope, receive, send)
        if request.url.path == "/" and _same(request.query_params.get("key", ""), self.api_key):
            response: Response = RedirectResponse("/", status_code=303)
            response.set_cookie(self.COOKIE, self.page_token, httponly=True, samesite="strict")
        else:
            error = RequestError(
                "invalid API key: send `Authorization: Bearer KEY` with the server's --api-key (in a browser, open /?key=KEY)",
                status=401,
                code="invalid_api_key",
            )
            response = _json(error_body(error), 401)
        await response(scope, receive, send)

    def _bearer_ok(self, request: Request) -> bool:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and _same(token.strip(), self.api_key)

    def _cookie_ok(self, request: Request) -> bool:
        return _same(request.cookies.get(self.COOKIE, ""), self.page_token)


def _is_page(request: Request) -> bool:
    return request.method == "GET" and (request.url.path == "/" or request.url.path.startswith("/watch/"))


def _same(given: str, expected: str | None) -> bool:
    return expected is not None and hmac.compare_digest(given.encode(), expected.encode())


def _check_json(request: Request) -> None:
    # A web page can POST text/plain (or a typeless body) to any address without
    # asking first (no CORS preflight): only a JSON content type is taken as JSON.
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise RequestError(
            f"the body must be JSON, sent with `Content-Type: application/json`; got {media or 'no content type'!r}",
            status=415,
            code="unsupported_media_type",
        )


async def _read_body(request: Request) -> bytes:
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY:
                raise RequestError(f"the request body is larger than {MAX_BODY} bytes", status=413, code="body_too_large")
            chunks.append(chunk)
    except ClientDisconnect:
        raise RequestError("the client hung up before sending the whole body", code="client_disconnected") from None
    return b"".join(chunks)


def _json(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(encode(obj), status_code=status, headers=headers, media_type="application/json")


def _error_headers(exc: RequestError) -> dict[str, str]:
    return dict(exc.headers)


async def _request_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestError)
    return _json(error_body(exc), exc.status, _error_headers(exc))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    message = f"{request.method} {request.url.path}: {exc.detail}"
    if exc.status_code == 404:
        message += f"; slotswarm serves {SERVED}"
    return _json(error_body(RequestError(message, status=exc.status_code, code=kind)), exc.status_code, dict(exc.headers or {}))


async def _server_error(request: Request, exc: Exception) -> Response:
    # A bug of ours: still an error object, and the server goes on.
    error = RequestError(f"internal error: {type(exc).__name__}: {exc}", status=500, type="server_error")
    return _json(error_body(error), 500)
