"""`ClusterSwarm`: the agents here, one GPU owner per device as Ray actors.

    async with ClusterSwarm(owners=2, model=path) as swarm:
        await swarm.spawn(PairProgrammer("pair", FOREGROUND))
        ...

The agents and their actor system (and so the whole wait graph) live in this
process; each owner runs today's owner loop and scheduler in its own Ray actor,
placed one per GPU where the cluster has GPUs. What crosses between them is a
turn (its tokens streamed back in one batch per owner wake-up with every other
turn's), a cancel, a lent priority, and the owner's events, merged here into
one stream with an `owner` field.

Ray is an optional extra (`pip install -e '.[cluster]'`) and needs the asyncio
backend of anyio.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio

from runtime.actors.system import ActorSystem
from runtime.errors import ConfigError
from runtime.scheduling.drafts import split_speculation
from swarm.cluster.client import ClusterGPU
from swarm.cluster.host import OwnerHost, OwnerInfo, OwnerSpec
from swarm.cluster.placement import Placement, Router
from swarm.hosting import AgentHost
from swarm.outlets import EventOutlets

STOP_GRACE_S = 30.0  # for the owners to end their turns at shutdown


def _ray() -> Any:
    try:
        import ray
    except ModuleNotFoundError:
        raise ConfigError("the cluster needs Ray: pip install -e '.[cluster]'") from None
    return ray


class ClusterSwarm(AgentHost):
    def __init__(
        self,
        owners: int | Sequence[OwnerSpec] = 2,
        *,
        address: str | None = None,
        model: str | Path | None = None,
        device: str | None = None,
        kernels: str | None = None,
        slots: int = 8,
        policy: str = "resident",
        step_tokens: int | None = None,
        shaping: bool = True,
        slack: float = 0.25,
        prefix_cache: bool = True,
        abandon_steps: bool = True,
        speculate: str = "off",
        placement: Placement | None = None,
        events: str | Path | None = None,
        terminal: bool = False,
        socket: str | Path | None = None,
        cluster: str = "ray",
    ) -> None:
        if cluster != "ray":
            raise ConfigError(f"unknown cluster kind {cluster!r}; choose 'ray'")
        if isinstance(owners, int):
            if owners < 1:
                raise ConfigError(f"a cluster needs at least one owner, got {owners}")
            model = None if model is None else str(model)
            owners = [
                OwnerSpec(
                    name=f"gpu{i}",
                    model=model,
                    device=device,
                    kernels=kernels,
                    slots=slots,
                    policy=str(policy),
                    step_tokens=step_tokens,
                    shaping=shaping,
                    slack=slack,
                    prefix_cache=prefix_cache,
                    abandon_steps=abandon_steps,
                    speculate=speculate,
                )
                for i in range(owners)
            ]
        names = [spec.name for spec in owners]
        if len(set(names)) != len(names):
            raise ConfigError(f"owner names must be unique, got {names}")
        for spec in owners:
            split_speculation(spec.speculate)  # (refused here, before any owner starts)
        self.specs = list(owners)
        self.address = address
        self.placement = placement
        self.outlets = EventOutlets(events, terminal=terminal, socket=socket)
        self.bus = self.outlets.bus
        self.system = ActorSystem(self.bus)
        self.handles: dict[str, Any] = {}
        self.infos: dict[str, OwnerInfo] = {}
        self.client: ClusterGPU | None = None  # what agents hold
        self._followed: set[str] = set()  # owners whose streams have ended
        self._followers_done = anyio.Event()
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> ClusterSwarm:
        # Exits run in reverse: stop the agents (cancelling their turns), stop the
        # owners (each ends what is left in one terminal event), wait for the last
        # of their events, announce the stop, close the stream, leave Ray.
        ray = _ray()
        async with AsyncExitStack() as stack:
            if not ray.is_initialized():
                ray.init(address=self.address, include_dashboard=False, log_to_driver=False, configure_logging=False)
                stack.callback(ray.shutdown)
            await self.outlets.open(stack, lambda: 0)
            self._start_owners(ray)
            stack.push_async_callback(self._kill_owners)
            infos = [await self.handles[spec.name].info.remote() for spec in self.specs]
            self.infos = {info.name: info for info in infos}
            tasks = await stack.enter_async_context(anyio.create_task_group())
            tokenizer = await anyio.to_thread.run_sync(self._tokenizer)  # agents encode their prompts here
            from gpu.grammar import ConstraintCompiler  # (the owners' model's vocabulary: constraints are checked here)

            zero = time.time() - self.bus.now()
            self.client = ClusterGPU(
                self.handles,
                {name: info.unix_start - zero for name, info in self.infos.items()},
                Router({name: info.model for name, info in self.infos.items()}, self.placement),
                self.bus,
                tokenizer,
                tasks,
                lent=self.system.waits.lent,
                constraints=ConstraintCompiler(tokenizer, tokenizer.vocab_size),
            )
            stack.push_async_callback(self._stop_owners, tasks)
            self.system.on_lift.append(self.client.lifted)
            self.system.on_actor_stopped.append(self.client.agent_stopped)
            await stack.enter_async_context(self.system)
            stack.push_async_callback(self._stop_agents)
            self.outlets.announce_start(
                slots=sum(s.slots for s in self.specs),
                policy=self.specs[0].policy,
                device=f"cluster of {len(self.specs)}: " + ", ".join(f"{i.name}={i.device}" for i in infos),
                model=infos[0].model,
            )
            for name in self.handles:
                tasks.start_soon(self._follow, name)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        return await self._stack.__aexit__(*exc_info)

    def _start_owners(self, ray: Any) -> None:
        gpus = ray.cluster_resources().get("GPU", 0)
        # One owner per GPU where there are GPUs; on a CPU-only cluster the owners
        # share the OpenCL CPU device and ask Ray for no CPU of their own.
        resources = {"num_gpus": 1} if gpus >= len(self.specs) else {"num_cpus": 0}
        Host = ray.remote(OwnerHost)
        for spec in self.specs:
            handle = Host.options(max_concurrency=10_000, **resources).remote(spec)
            self.handles[spec.name] = handle
            handle.serve.remote()

    def _tokenizer(self) -> Any:
        from gpu.model.fetch import resolve_model
        from gpu.model.load import load_model
        from gpu.model.tokenizer import Tokenizer

        return Tokenizer.from_model(load_model(resolve_model(self.specs[0].model)))

    async def _stop_agents(self) -> None:
        with anyio.CancelScope(shield=True):
            await self.system.stop(*self.system.names())

    async def _follow(self, name: str) -> None:
        # An owner's two streams, its turns' updates and its events, both end
        # when it stops (after every turn's end) or dies.
        async with anyio.create_task_group() as streams:
            streams.start_soon(self.client.receive, name)
            await self.client.follow(name)
        self._followed.add(name)
        self._followers_done.set()

    async def _stop_owners(self, tasks: anyio.abc.TaskGroup) -> None:
        # Each owner's own shutdown ends its turns in exactly one terminal event,
        # and its event stream ends after them.
        self.client.closed = True
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(STOP_GRACE_S):
                for name in sorted(self.client.router.live):
                    try:
                        await self.handles[name].stop.remote()
                    except Exception:
                        pass  # lost meanwhile
                while self._followed != set(self.handles):
                    self._followers_done = anyio.Event()
                    await self._followers_done.wait()
        tasks.cancel_scope.cancel()  # an owner that did not stop in time is not waited for

    async def _kill_owners(self) -> None:
        for handle in self.handles.values():
            _ray().kill(handle, no_restart=True)

    def kill_owner(self, name: str) -> None:
        """Kill an owner's process, as a crash would (fault drills and tests)."""
        _ray().kill(self.handles[name], no_restart=True)
