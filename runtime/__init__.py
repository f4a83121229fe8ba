"""The runtime: actors, the scheduler, the GPU owner, priority inheritance, events.

Most users want the public names re-exported by `swarm`."""

from runtime.actors.actor import Actor, Ref, handler
from runtime.actors.lock import Lock
from runtime.actors.system import ActorSystem
from runtime.agent import Agent, PauseInfo, ResumeInfo, TurnHandle
from runtime.events.bus import EventBus
from runtime.events.kinds import Event, read_events
from runtime.owner.client import GPUClient
from runtime.owner.owner import GPUOwner
from runtime.scheduling.priority import BACKGROUND, FOREGROUND
from runtime.scheduling.scheduler import Scheduler
from runtime.scheduling.turns import Policy, SchedulerConfig
from runtime.scheduling.work import GREEDY, Engine, Sampling, Work

__all__ = [
    "Actor",
    "ActorSystem",
    "Agent",
    "BACKGROUND",
    "Engine",
    "Event",
    "EventBus",
    "FOREGROUND",
    "GPUClient",
    "GPUOwner",
    "GREEDY",
    "Lock",
    "PauseInfo",
    "Policy",
    "Ref",
    "ResumeInfo",
    "Sampling",
    "Scheduler",
    "SchedulerConfig",
    "TurnHandle",
    "Work",
    "handler",
    "read_events",
]
