"""`Swarm`: one GPU owner, many agents, one event stream.

    async with Swarm(engine, slots=8, policy="resident", events="events.jsonl") as swarm:
        await swarm.spawn(PairProgrammer("pair", FOREGROUND))
        await swarm.spawn(Reviewer("reviewer"))
        ...

Leaving the block stops every agent, ends every turn in exactly one terminal
event, frees the KV and closes the event stream.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio

from runtime.actors.system import ActorSystem
from runtime.errors import ConfigError
from runtime.events.bus import EventBus
from runtime.events.kinds import SwarmStarted, SwarmStopped
from runtime.events.stream import serve_events
from runtime.owner.client import LocalGPU
from runtime.owner.drafter import DraftModel
from runtime.owner.owner import GPUOwner
from runtime.scheduling.drafts import Speculate, split_speculation
from runtime.scheduling.turns import Policy, SchedulerConfig
from runtime.scheduling.work import Engine
from swarm.hosting import AgentHost


class Swarm(AgentHost):
    """One GPU owner in this process. A swarm over several owners, each a Ray
    actor, is swarm.cluster.ClusterSwarm: the same agents and API."""

    def __init__(
        self,
        engine: Engine,
        *,
        slots: int = 8,
        policy: str | Policy = Policy.RESIDENT,
        step_tokens: int | None = None,
        aging_s: float = 10.0,
        swap_blocks: int | None = None,
        shaping: bool = True,
        slack: float = 0.25,
        prefix_cache: bool = True,
        abandon_steps: bool = True,
        speculate: str = "off",
        draft: Engine | None = None,
        events: str | Path | None = None,
        terminal: bool = False,
        socket: str | Path | None = None,
        model_name: str | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """`clock` (seconds, default the wall clock from now) stamps every event
        and arrival: a virtual one lets a test or simulation run the real owner
        in virtual time. `speculate` ("off", "lookup", "draft" or
        "draft:MODEL") turns speculative decoding on for the foreground turn
        and turns running alone (runtime.scheduling.drafts); with "draft", the
        draft model is `draft` if given (an engine of its own: its own KV),
        else MODEL, else the catalogue's draft for the engine's model, opened
        on the engine's device."""
        kind, draft_name = split_speculation(speculate)
        drafter = None
        if kind is Speculate.DRAFT:
            drafter = DraftModel(draft if draft is not None else open_draft(engine, draft_name), engine)
        limit = engine.max_batch_tokens
        if step_tokens is None:
            step_tokens = min(128, limit or 128)
        if limit is not None and step_tokens > limit:
            raise ConfigError(f"step_tokens ({step_tokens}) exceeds what the engine batches per step ({limit})")
        self.config = SchedulerConfig(
            slots=slots,
            policy=policy,
            step_tokens=step_tokens,
            aging_s=aging_s,
            swap_blocks=swap_blocks,
            shaping=shaping,
            slack=slack,
            prefix_cache=prefix_cache,
            abandon_steps=abandon_steps,
            speculate=speculate,
            max_context=engine.max_context,
        )
        self.engine = engine
        self.bus = EventBus(clock=clock)
        self.events_path = self.bus.log_to_file(events) if events else None
        if terminal:
            self.bus.log_to_terminal()
        self.socket = Path(socket) if socket else None
        self.model_name = model_name or engine.model_name
        self.system = ActorSystem(self.bus)
        self.owner = GPUOwner(engine, self.config, self.bus, drafter=drafter)
        self.client = LocalGPU(self.system, self.owner.name, self.bus.now, engine.tokenizer, engine.constraints)  # what agents hold
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> Swarm:
        # Exits run in reverse: stop the agents, then the owner (whose on_stop ends
        # whatever turns are left), then announce the stop and close the stream.
        async with AsyncExitStack() as stack:
            tasks = await stack.enter_async_context(anyio.create_task_group())
            if self.socket:
                await tasks.start(serve_events, self.bus, self.socket)
            stack.push_async_callback(self._announce_stop)
            await stack.enter_async_context(self.system)
            stack.push_async_callback(self._stop_agents)
            self.bus.emit(
                SwarmStarted(
                    t=self.bus.now(),
                    step=0,
                    unix_time=time.time(),
                    slots=self.config.slots,
                    policy=self.config.policy.value,
                    device=self.engine.device_name,
                    model=self.model_name,
                )
            )
            await self.system.spawn(self.owner)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        return await self._stack.__aexit__(*exc_info)

    async def _stop_agents(self) -> None:
        self.owner.intake.closing = True
        with anyio.CancelScope(shield=True):
            await self.system.stop(*(name for name in self.system.names() if name != self.owner.name))

    async def _announce_stop(self) -> None:
        self.bus.emit(SwarmStopped(t=self.bus.now(), step=self.owner.scheduler.step, unix_time=time.time()))
        self.bus.close()


def open_draft(engine: Engine, name: str | None) -> Engine:
    """The draft model `name` (None: the catalogue's draft for the engine's
    model) as an engine of its own, on the engine's device and kernels."""
    from gpu.engine import OpenCLEngine, open_engine
    from gpu.model.catalogue import CATALOGUE, DRAFT_MODELS

    if not isinstance(engine, OpenCLEngine):
        raise ConfigError("speculate=draft on this engine needs the draft model's engine given (Swarm(draft=...))")
    if name is None:
        target = next((n for n, e in CATALOGUE.items() if e.filename == engine.model_name), None)
        name = DRAFT_MODELS.get(target or "")
        if name is None:
            raise ConfigError(f"no draft model is known for {engine.model_name}; name one: --speculate draft:MODEL")
    # (its K/V holds a foreground turn or two: a small share of the device's memory)
    return open_engine(name, engine.device, kernels=engine.kernels, kv_fraction=0.05)
