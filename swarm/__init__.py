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
from runtime.errors import (  # the whole tree (see runtime/errors.py)
    ActorCrashed,
    ActorError,
    AskTimeout,
    ConfigError,
    DeviceError,
    EngineError,
    ModelError,
    ModelFormatError,
    RequestError,
    SlotswarmError,
    TurnCancelled,
    TurnError,
    TurnFailed,
    UnhandledMessage,
    UnsupportedModelError,
    UsageError,
    WaitCycle,
)
from runtime.scheduling.constraints import Choices, Grammar, JsonSchema, Regex
from runtime.toolcalls import ToolCall
from runtime.tools import Tool, tool
from swarm.api import Swarm

__all__ = [
    "Choices", "Grammar", "JsonSchema", "Regex", "Tool", "ToolCall", "tool",
    "Actor", "ActorCrashed", "ActorError", "Agent", "AskTimeout", "BACKGROUND", "ConfigError", "DeviceError",
    "EngineError", "Event", "FOREGROUND", "GREEDY", "Lock", "ModelError", "ModelFormatError", "PauseInfo", "Policy",
    "RequestError", "ResumeInfo", "Sampling", "SlotswarmError", "Swarm", "TurnCancelled", "TurnError", "TurnFailed",
    "TurnHandle", "UnhandledMessage", "UnsupportedModelError", "UsageError", "WaitCycle", "handler", "read_events",
]
