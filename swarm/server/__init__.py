"""`swarm serve`: the swarm behind an OpenAI-compatible HTTP endpoint.

    async with Swarm(engine, slots=8) as swarm:
        await swarm.spawn(Reviewer("reviewer"))          # in-process agents, if any
        await serve(swarm, model_id="smollm2", port=8000)  # until SIGINT / SIGTERM

Outside agents (any OpenAI client) join the swarm as agents with a priority; see
`swarm.server.gateway`. The HTTP server is uvicorn running a Starlette app on the
swarm's own event loop, so a request reaches the GPU owner over a memory channel.

Shutdown (a signal, or `ServerHandle.shutdown()`): the listening socket closes,
new requests on open connections get 503, running turns have `grace_s` to
finish, then the rest are cancelled (each ends in exactly one turn.cancelled and
its client gets an error), and `serve` returns. A second signal skips the grace.
"""

from __future__ import annotations

import contextlib
import signal
import socket
from collections.abc import Iterator, Sequence
from pathlib import Path

import anyio
import anyio.abc
import uvicorn
from starlette.routing import BaseRoute

from runtime.errors import ConfigError
from swarm.api import Swarm
from swarm.server.app import build_app
from swarm.server.gateway import Gateway
from swarm.server.metrics import Metrics
from swarm.viewers.watch import WatchHub, follow_bus, watch_routes
from swarm.viewers.watch import listen as watch_listen

__all__ = ["ServerHandle", "listen", "serve"]


class ServerHandle:
    """What `serve` reports once it listens: where, and how to stop it."""

    def __init__(self, url: str, server: uvicorn.Server, gateway: Gateway) -> None:
        self.url = url
        self.gateway = gateway
        self._server = server

    def shutdown(self, *, now: bool = False) -> None:
        """Begin the graceful shutdown; `now` skips the grace period."""
        if now:
            self.gateway.hurry.set()
        self._server.should_exit = True


async def serve(
    swarm: Swarm,
    *,
    model_id: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    max_queue: int | None = None,
    grace_s: float = 10.0,
    log_prompts: str | Path | None = None,
    handle_signals: bool = True,
    routes: Sequence[BaseRoute] = (),
    sock: socket.socket | None = None,
    task_status: anyio.abc.TaskStatus[ServerHandle] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `swarm` over HTTP until shut down. Port 0 picks a free port; the
    handle given to `task_status` has the URL. `routes` are served beside the API.
    `sock`, from `listen(host, port)`, is the socket to serve on when it is bound
    ahead (so a port in use is an error before the model loads)."""
    if max_queue is not None and max_queue < 0:
        raise ConfigError(f"--max-queue must be at least 0, got {max_queue}")
    if grace_s < 0:
        raise ConfigError(f"--grace must be at least 0, got {grace_s}")
    gateway = Gateway(swarm, model_id=model_id, max_queue=max_queue, log_prompts=log_prompts)
    metrics = gateway.metrics = Metrics(swarm)
    hub = WatchHub(source="swarm serve")
    app = build_app(gateway, metrics, api_key=api_key, host=host, routes=[*watch_routes(hub), *routes])  # the live page at /
    sock = sock or listen(host, port)
    config = uvicorn.Config(
        app,
        log_config=None,
        log_level="warning",
        access_log=False,
        lifespan="off",
        ws="none",
        timeout_graceful_shutdown=grace_s + 10,  # a backstop: the gateway ends every turn by grace_s
    )
    server = _Server(config)
    bound_host, bound_port = sock.getsockname()[:2]
    url = f"http://{'[' + bound_host + ']' if ':' in bound_host else bound_host}:{bound_port}"
    async with anyio.create_task_group() as tg:
        await tg.start(metrics.follow)
        await tg.start(follow_bus, hub, swarm.bus)
        tg.start_soon(_drain_on_exit, server, gateway, grace_s, hub)
        if handle_signals:
            tg.start_soon(_stop_on_signal, server, gateway)
        task_status.started(ServerHandle(url, server, gateway))
        await server.serve(sockets=[sock])
        tg.cancel_scope.cancel()


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: `serve` owns the signals, so a
    SIGTERM ends in an orderly shutdown of the swarm rather than being re-raised."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on `host`:`port` (0: any free port) for uvicorn, or a
    ConfigError saying why not."""
    sock = watch_listen(host, port)
    sock.setblocking(False)
    return sock


async def _drain_on_exit(server: uvicorn.Server, gateway: Gateway, grace_s: float, hub: WatchHub) -> None:
    while not server.should_exit:
        await anyio.sleep(0.05)
    hub.close()  # open pages' streams end now, not at the shutdown's backstop
    await gateway.shutdown(grace_s)


async def _stop_on_signal(server: uvicorn.Server, gateway: Gateway) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            if server.should_exit:  # the second one: no more grace
                gateway.hurry.set()
            server.should_exit = True
