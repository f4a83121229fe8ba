"""The runner behind `swarm run`: one session, from its agents to its summary."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from runtime.scheduling.priority import FOREGROUND
from runtime.scheduling.work import Engine
from swarm.agent_loading import build_agents, new_out_dir, resolve_path, workspace_of
from swarm.session import Session
from swarm.viewers.watch import WatchHub, create_app, follow_bus, serve_http

if TYPE_CHECKING:
    from swarm.api import Swarm
    from swarm.cluster import ClusterSwarm


class SessionRunner:
    """Runs one session. `run()` is async; `events_path` and `agents`
    stay readable afterwards (also after Ctrl-C) for the summary."""

    def __init__(
        self,
        session: Session,
        *,
        engine: Engine | None = None,
        out: Path | None = None,
        socket: Path | str | None = None,
        on_event: Callable[[Any], None] | None = None,
        say: Callable[[str], None] | None = None,
        page_sockets: Sequence[socket.socket] = (),
        cluster: str | None = None,
        owners: int = 2,
    ) -> None:
        self.session = session
        # With a cluster ("local", or a Ray address), `owners` GPU owners run as Ray actors.
        self.cluster, self.owners = cluster, owners
        self.workspace = workspace_of(session)  # fail early, before loading a model
        self.engine = engine
        self.out = out or new_out_dir(session)
        self.events_path = self.out / "events.jsonl"
        self.socket = socket
        self.on_event = on_event
        self.say = say
        self.agents = build_agents(session, self.workspace, self.out, say)
        self.started = self.stopped = None
        self.swarm: Swarm | ClusterSwarm | None = None  # once it has started
        # `swarm run --watch`: the page, on sockets from swarm.viewers.watch.bind_loopback, is
        # served from before the model loads, so a browser opened right away waits
        # for the swarm instead of failing.
        self.page_sockets = list(page_sockets)
        self.page_urls = [f"http://127.0.0.1:{s.getsockname()[1]}/" for s in self.page_sockets]
        self.hub = WatchHub(source="swarm run") if self.page_sockets else None

    def load_engine(self) -> Engine:
        if self.engine is None:
            from gpu.engine import open_engine

            self.engine = open_engine(self.model_spec(), self.session.device, kernels=self.session.kernels)
        return self.engine

    def model_spec(self) -> str | Path | None:
        """The session's model: a catalogue name, or a path relative to the session file."""
        from gpu.model.fetch import is_model_name, looks_like_a_name

        spec = self.session.model
        if not spec or is_model_name(spec):
            return spec
        path = resolve_path(self.session, spec)
        # A bare word that is no file next to the session is a (maybe misspelt) catalogue name.
        return spec if looks_like_a_name(spec) and not path.exists() else path

    async def run(self) -> None:
        # A cluster's owners each open their own engine; else it is opened here.
        load = (lambda: None) if self.cluster is not None else self.load_engine
        if self.hub is None:
            return await self._run(load())
        async with anyio.create_task_group() as page:
            page.start_soon(partial(serve_http, create_app(self.hub), self.page_sockets, on_stop=[self.hub.close]))
            await self._run(await anyio.to_thread.run_sync(load))
            page.cancel_scope.cancel()

    async def _run(self, engine: Any) -> None:
        from swarm.api import Swarm
        from swarm.cluster import ClusterSwarm

        s = self.session
        common = dict(
            slots=s.slots,
            policy=s.policy,
            step_tokens=s.step_tokens,
            shaping=s.shaping,
            slack=s.slack,
            prefix_cache=s.prefix_cache,
            speculate=s.speculate,
            events=self.events_path,
            socket=self.socket,
        )
        swarm: Swarm | ClusterSwarm
        if self.cluster is not None:
            swarm = ClusterSwarm(
                owners=self.owners,
                address=None if self.cluster == "local" else self.cluster,
                model=self.model_spec(),
                device=s.device,
                kernels=s.kernels,
                **common,
            )
        else:
            swarm = Swarm(engine, **common)
        self.started = time.monotonic()
        try:
            async with anyio.create_task_group() as viewers:
                if self.hub is not None:
                    await viewers.start(follow_bus, self.hub, swarm.bus)
                if self.on_event is not None:
                    # From swarm.started on; ends by itself when the swarm closes its event stream.
                    viewers.start_soon(self._forward, swarm.bus.subscribe())
                async with swarm:
                    self.swarm = swarm
                    # Background first, so the foreground arrives to a busy GPU.
                    order = sorted(self.agents, key=lambda a: a.priority)
                    for agent in order:
                        await swarm.spawn(agent)
                    await self._until_done(swarm, [a for a in order if a.priority >= FOREGROUND])
        finally:
            self.stopped = time.monotonic()

    async def _until_done(self, swarm: Any, foreground: list[Any]) -> None:
        """Until the duration is up, or every foreground agent has finished."""
        with anyio.move_on_after(self.session.duration if self.session.duration is not None else float("inf")) as timer:
            if not foreground:
                await anyio.sleep_forever()
            for agent in foreground:
                await swarm.join(agent)
        if timer.cancelled_caught and self.say is not None:
            self.say(f"the session's duration ({self.session.duration:g} s) is up: stopping, and cancelling the turns still running")

    async def _forward(self, sub: Any) -> None:
        async for item in sub:
            self.on_event(item)
