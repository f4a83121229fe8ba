"""`Swarm`: one GPU owner, many agents, one event stream.

    async with Swarm(engine, slots=8, policy="resident", events="events.jsonl") as swarm:
        await swarm.spawn(PairProgrammer("pair", FOREGROUND))
        await swarm.spawn(Reviewer("reviewer"))
        ...

Leaving the block stops every agent, ends every turn in exactly one terminal
event, frees the KV and closes the event stream (swarm.outlets).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio

from runtime.actors.system import ActorSystem
from runtime.errors import ConfigError
from runtime.owner.client import LocalGPU
from runtime.owner.drafter import DraftModel
from runtime.owner.owner import GPUOwner
from runtime.scheduling.drafts import Speculate, split_speculation
from runtime.scheduling.turns import Policy, SchedulerConfig
from runtime.scheduling.work import Engine
from swarm.hosting import AgentHost
from swarm.outlets import EventOutlets


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
        on the engine's device. A draft model is opened and checked against
        the engine's tokens when the swarm is entered, in a worker thread (a
        ConfigError there is `async with`'s), and let go of when it exits."""
        kind, draft_name = split_speculation(speculate)
        # (opening a draft model is seconds of device work, and checking its
        # tokens reads both vocabularies: neither belongs on the event loop;
        # a name nothing can be opened from is refused here)
        self._make_drafter: Callable[[], DraftModel] | None = None
        if kind is Speculate.DRAFT:
            if draft is None:
                name = draft_model_name(engine, draft_name)
                self._make_drafter = lambda: DraftModel(open_draft(engine, name), engine)
            else:
                self._make_drafter = lambda: DraftModel(draft, engine)
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
        self.outlets = EventOutlets(events, terminal=terminal, socket=socket, clock=clock)
        self.bus = self.outlets.bus
        self.model_name = model_name or engine.model_name
        self.system = ActorSystem(self.bus)
        self.client: LocalGPU | None = None  # what agents hold (made at entry, with the owner)
        self._stack = AsyncExitStack()

    # Made when the swarm is entered, once the draft model (if any) is open.
    owner: GPUOwner

    async def __aenter__(self) -> Swarm:
        try:
            drafter = await self._open_drafter()
        except BaseException:
            self.bus.close()  # (it never started: its stream ends empty)
            raise
        self.owner = GPUOwner(self.engine, self.config, self.bus, drafter=drafter)
        self.client = LocalGPU(self.system, self.owner.name, self.bus.now, self.engine.tokenizer, self.engine.constraints)
        # Exits run in reverse: stop the agents, then the owner (whose on_stop ends
        # whatever turns are left), then announce the stop and close the stream,
        # and let go of the draft model.
        async with AsyncExitStack() as stack:
            if drafter is not None:
                stack.callback(drafter.close)
            await self.outlets.open(stack, lambda: self.owner.scheduler.step)
            await stack.enter_async_context(self.system)
            stack.push_async_callback(self._stop_agents)
            self.outlets.announce_start(
                slots=self.config.slots, policy=self.config.policy.value, device=self.engine.device_name, model=self.model_name
            )
            await self.system.spawn(self.owner)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        return await self._stack.__aexit__(*exc_info)

    async def _open_drafter(self) -> DraftModel | None:
        """The draft model, opened if named and checked against the engine's
        tokens, in a worker thread. Cancelled, it waits for the thread and drops
        what it opened; refused, the error is the entry's, as itself."""
        if self._make_drafter is None:
            return None
        drafter = await anyio.to_thread.run_sync(self._make_drafter)
        await anyio.lowlevel.checkpoint_if_cancelled()  # (cancelled while it opened: it goes unused)
        return drafter

    async def _stop_agents(self) -> None:
        self.owner.intake.closing = True
        with anyio.CancelScope(shield=True):
            await self.system.stop(*(name for name in self.system.names() if name != self.owner.name))


def draft_model_name(engine: Engine, name: str | None) -> str:
    """The draft model to open for `engine`: `name`, or (None) the catalogue's
    draft for the engine's model. Checked without opening anything."""
    from gpu.engine import OpenCLEngine
    from gpu.model.catalogue import CATALOGUE, DRAFT_MODELS
    from gpu.model.fetch import is_model_name, looks_like_a_name, unknown_model

    if not isinstance(engine, OpenCLEngine):
        raise ConfigError("speculate=draft on this engine needs the draft model's engine given (Swarm(draft=...))")
    if name is None:
        target = next((n for n, e in CATALOGUE.items() if e.filename == engine.model_name), None)
        name = DRAFT_MODELS.get(target or "")
        if name is None:
            raise ConfigError(f"no draft model is known for {engine.model_name}; name one: --speculate draft:MODEL")
    elif looks_like_a_name(name) and not is_model_name(name) and not Path(name).expanduser().is_file():
        raise ConfigError(f"draft model: {unknown_model(name)}")
    return name


def open_draft(engine: Engine, name: str | None) -> Engine:
    """The draft model `name` (None: the catalogue's draft for the engine's
    model) as an engine of its own, on the engine's device and kernels. Device
    work that takes seconds: `Swarm` runs it in a worker thread."""
    from gpu.engine import open_engine

    name = draft_model_name(engine, name)
    # (its K/V holds a foreground turn or two: a small share of the device's memory)
    return open_engine(name, engine.device, kernels=engine.kernels, kv_fraction=0.05)
