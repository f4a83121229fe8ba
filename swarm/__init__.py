"""slotswarm's public API: write agents, start a swarm, watch it.

    from swarm import Agent, Swarm, FOREGROUND, handler
"""

from runtime import (
    BACKGROUND,
    FOREGROUND,
    GREEDY,
    Actor,
    Agent,
    Event,
    Lock,
    PauseInfo,
    Policy,
    ResumeInfo,
    Sampling,
    TurnHandle,
    handler,
    read_events,
)
from runtime.errors import (
    ActorCrashed,
    AskTimeout,
    ConfigError,
    SlotswarmError,
    TurnCancelled,
    TurnFailed,
    UnhandledMessage,
    WaitCycle,
)
from swarm.api import Swarm

__all__ = [
    "Actor", "ActorCrashed", "Agent", "AskTimeout", "BACKGROUND", "ConfigError", "Event", "FOREGROUND", "GREEDY",
    "Lock", "PauseInfo", "Policy", "ResumeInfo", "Sampling", "SlotswarmError", "Swarm", "TurnCancelled",
    "TurnFailed", "TurnHandle", "UnhandledMessage", "WaitCycle", "handler", "read_events",
]
