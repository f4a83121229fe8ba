"""A swarm's event stream: one bus and where it goes, from the start to the stop.

`swarm.api.Swarm` and `swarm.cluster.ClusterSwarm` each own one. The bus feeds a
JSONL log (`events`), the terminal, and a Unix socket that `swarm tail` reads
(runtime.events.stream), and the stream opens with `swarm.started` and closes
with `swarm.stopped`, whoever runs the owners.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path

import anyio

from runtime.events.bus import EventBus
from runtime.events.kinds import SwarmStarted, SwarmStopped
from runtime.events.stream import serve_events


class EventOutlets:
    def __init__(
        self,
        events: str | Path | None = None,
        *,
        terminal: bool = False,
        socket: str | Path | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.bus = EventBus(clock=clock)
        self.path = self.bus.log_to_file(events) if events else None
        if terminal:
            self.bus.log_to_terminal()
        self.socket = Path(socket) if socket else None

    async def open(self, stack: AsyncExitStack, step: Callable[[], int]) -> None:
        """Serve the socket, if there is one, while the swarm runs; as `stack`
        exits, after whatever it enters next, announce the stop (at `step()`)
        and close the stream, which ends the socket's viewers."""
        tasks = await stack.enter_async_context(anyio.create_task_group())
        if self.socket:
            await tasks.start(serve_events, self.bus, self.socket)
        stack.push_async_callback(self._announce_stop, step)

    def announce_start(self, *, slots: int, policy: str, device: str, model: str) -> None:
        self.bus.emit(SwarmStarted(t=self.bus.now(), step=0, unix_time=time.time(), slots=slots, policy=policy, device=device, model=model))

    async def _announce_stop(self, step: Callable[[], int]) -> None:
        self.bus.emit(SwarmStopped(t=self.bus.now(), step=step(), unix_time=time.time()))
        self.bus.close()
