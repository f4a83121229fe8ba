"""The page's HTTP side: its routes on Starlette, and a loopback-only server.

    hub = WatchHub()
    app = Starlette(routes=[*your_routes, *watch_routes(hub)])   # the page at /
    sock = bind_loopback(8765)                                   # errors here, before any task starts
    async with anyio.create_task_group() as tg:
        await tg.start(follow_bus, hub, swarm.bus)               # or follow_socket, load_file
        tg.start_soon(serve_http, app, sock)

Routes: `/` (the page), `/watch/static/...` (its script and style, shipped as
package data) and `/watch/events` (the server-sent event stream of `hub`).
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import socket
from pathlib import Path

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from runtime.errors import ConfigError
from swarm.viewers.watch.hub import WatchHub

STATIC = Path(__file__).with_name("static")
LOOPBACK = "127.0.0.1"
DEFAULT_PORT = 8765
# Names a browser on this machine uses for us. Anything else in the Host header is
# a DNS-rebinding page trying to read the stream from outside: refused.
LOCAL_HOSTS = ["127.0.0.1", "localhost", "[::1]"]


def watch_routes(hub: WatchHub) -> list[BaseRoute]:
    """The page and its event stream, to add to any Starlette app. They answer
    this machine only, even in an app listening beyond it."""

    async def page(request: Request) -> Response:
        if not _local(request):
            return PlainTextResponse("the swarm's page is served to this machine only", status_code=403)
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    async def events(request: Request) -> Response:
        if not _local(request):
            return PlainTextResponse("the swarm's events are served to this machine only", status_code=403)
        return StreamingResponse(
            # The browser sends Last-Event-ID when it reconnects by itself; the page
            # passes ?last= when it has to open a new stream.
            hub.stream(request.headers.get("last-event-id") or request.query_params.get("last")),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    return [
        Route("/", page),
        Route("/watch/events", events),
        Mount("/watch/static", StaticFiles(directory=STATIC), name="watch-static"),
    ]


def _local(request: Request) -> bool:
    return request.client is not None and request.client.host in ("127.0.0.1", "::1")


def create_app(hub: WatchHub) -> Starlette:
    """An app serving only the page: what `swarm watch` and `swarm run --watch` run."""
    return Starlette(routes=watch_routes(hub), middleware=[trusted_hosts(LOOPBACK)])


def trusted_hosts(host: str) -> Middleware:
    """The Host header check for an app listening on `host`: on loopback only the
    names a browser on this machine uses; on another address those and the
    address itself. On every address (0.0.0.0, ::) any name a client knows the
    machine by is fair, so none is refused: there only an API key guards."""
    if host in ("0.0.0.0", "::", ""):
        allowed = ["*"]
    elif _loopback(host):
        allowed = LOCAL_HOSTS
    else:
        allowed = [*LOCAL_HOSTS, f"[{host}]" if ":" in host else host]
    return Middleware(TrustedHostMiddleware, allowed_hosts=allowed)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class _Server(uvicorn.Server):
    # Ctrl-C belongs to the program we run in (the swarm stops cleanly on it);
    # uvicorn would otherwise take SIGINT over and re-raise it after its shutdown.
    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[override]
        yield


async def serve_http(app: Starlette, sock: socket.socket | list[socket.socket], *, on_stop: list | None = None) -> None:
    """Serve `app` on a socket from `bind_loopback` (or several) until cancelled.
    Each callable in `on_stop` runs first when stopping (e.g. `hub.close`, to end
    the streams)."""
    socks = sock if isinstance(sock, list) else [sock]
    config = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=1)
    server = _Server(config)

    async def run() -> None:
        # Shielded: a cancelled server must still close its connections.
        with anyio.CancelScope(shield=True):
            await server.serve(sockets=socks)
        tg.cancel_scope.cancel()  # it stopped by itself

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        try:
            await anyio.sleep_forever()
        finally:
            for stop in on_stop or ():
                stop()
            server.should_exit = True


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on `host`:`port` (0: any free port; see
    `sock.getsockname()[1]`), or a ConfigError saying why not. Clients can
    connect from here on: the kernel queues them until the server runs."""
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port must be between 0 and 65535, got {port}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(f"port {port} is already in use on {host}; choose another with --port") from None
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(2048)
    return sock


def bind_loopback(port: int = DEFAULT_PORT) -> socket.socket:
    """A listening socket on 127.0.0.1:`port`, which a page server started
    later in another process can inherit."""
    sock = listen(LOOPBACK, port)
    sock.set_inheritable(True)
    return sock
