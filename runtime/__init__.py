"""The runtime: actors, the scheduler, the GPU owner, priority inheritance, events.

Most users want the public names re-exported by `swarm`."""

from runtime.actors import Actor, Ref, handler
from runtime.agent import Agent, PauseInfo, ResumeInfo, TurnHandle
from runtime.engine import GREEDY, Engine, Sampling, Work
from runtime.bus import EventBus
from runtime.client import GPUClient
from runtime.events import Event, read_events
from runtime.lock import Lock
from runtime.owner import GPUOwner
from runtime.priority import BACKGROUND, FOREGROUND
from runtime.scheduler import Scheduler
from runtime.system import ActorSystem
from runtime.turns import Policy, SchedulerConfig

__all__ = [
    "Actor", "ActorSystem", "Agent", "BACKGROUND", "Engine", "Event", "EventBus", "FOREGROUND", "GPUClient", "GPUOwner",
    "GREEDY", "Lock", "PauseInfo", "Policy", "Ref", "ResumeInfo", "Sampling", "Scheduler", "SchedulerConfig",
    "TurnHandle", "Work", "handler", "read_events",
]
