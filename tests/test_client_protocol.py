"""Both GPU clients, the local owner's and the cluster's, declare and keep the
one interface agents use (runtime.owner.client.GPUClient)."""

from __future__ import annotations

import inspect

import anyio
import pytest

from runtime.actors.system import ActorSystem
from runtime.events.bus import EventBus
from runtime.owner.client import GPUClient, LocalGPU
from swarm.cluster.client import ClusterGPU
from swarm.cluster.placement import Router

METHODS = ("new_turn_id", "submit", "cancel")


@pytest.mark.parametrize("client", [LocalGPU, ClusterGPU])
def test_each_client_declares_the_protocol_and_keeps_its_methods_signatures(client):
    assert GPUClient in client.__mro__  # declared, not only shaped alike
    for name in METHODS:
        want = inspect.signature(getattr(GPUClient, name))
        have = inspect.signature(getattr(client, name))
        assert inspect.iscoroutinefunction(getattr(client, name)) == inspect.iscoroutinefunction(getattr(GPUClient, name)), name
        # Every parameter the protocol names is there, in order and of the same kind;
        # anything more is optional.
        theirs = list(have.parameters.values())
        for i, param in enumerate(want.parameters.values()):
            assert theirs[i].name == param.name and theirs[i].kind == param.kind, (name, theirs[i], param)
        assert all(p.default is not inspect.Parameter.empty for p in theirs[len(want.parameters) :]), name


@pytest.mark.anyio
async def test_a_built_client_of_either_kind_is_a_gpu_client():
    bus = EventBus()
    local = LocalGPU(ActorSystem(bus), "owner", bus.now, None)
    assert isinstance(local, GPUClient)
    async with anyio.create_task_group() as tasks:
        cluster = ClusterGPU({}, {}, Router({"gpu0": None}), bus, None, tasks, lent=lambda key: None)
        assert isinstance(cluster, GPUClient)
        assert cluster.new_turn_id() != cluster.new_turn_id() and local.new_turn_id() != local.new_turn_id()
