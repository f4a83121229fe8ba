"""What a swarm offers its agents, on one GPU or across a cluster: spawn and join.

`swarm.api.Swarm` and `swarm.cluster.ClusterSwarm` differ in where the GPU is;
to an agent they are the same, so both take agents here.
"""

from __future__ import annotations

from runtime.actors.system import ActorSystem
from runtime.agent import Agent
from runtime.errors import UsageError
from runtime.owner.client import GPUClient


class AgentHost:
    # The swarm's own: the agents' actor system, and the GPU client they reach
    # the owner (or owners) through.
    system: ActorSystem
    client: GPUClient | None

    async def spawn(self, agent: Agent) -> Agent:
        if not isinstance(agent, Agent):
            raise UsageError(f"Swarm.spawn takes an Agent, got {type(agent).__qualname__}")
        agent.gpu = self.client
        await self.system.spawn(agent)
        return agent

    async def join(self, agent: Agent | str) -> None:
        """Wait until an agent's run() has ended: it returned, crashed or was
        stopped. The agent still answers asks until the swarm stops."""
        await self.system.wait_run(agent)
