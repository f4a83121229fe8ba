"""The runtime: actors, the scheduler, the GPU owner, priority inheritance, events.

Most users want the public names re-exported by `swarm`."""

from runtime.actors.actor import Actor, Ref, handler
from runtime.agent import Agent, PauseInfo, ResumeInfo, TurnHandle
from runtime.scheduling.work import GREEDY, Engine, Sampling, Work
from runtime.events.bus import EventBus
from runtime.owner.client import GPUClient
from runtime.events.kinds import Event, read_events
from runtime.actors.lock import Lock
from runtime.owner.owner import GPUOwner
from runtime.scheduling.priority import BACKGROUND, FOREGROUND
from runtime.scheduling.scheduler import Scheduler
from runtime.actors.system import ActorSystem
from runtime.scheduling.turns import Policy, SchedulerConfig

__all__ = [
    "Actor", "ActorSystem", "Agent", "BACKGROUND", "Engine", "Event", "EventBus", "FOREGROUND", "GPUClient", "GPUOwner",
    "GREEDY", "Lock", "PauseInfo", "Policy", "Ref", "ResumeInfo", "Sampling", "Scheduler", "SchedulerConfig",
    "TurnHandle", "Work", "handler", "read_events",
]
