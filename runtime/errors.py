"""Every error slotswarm raises on purpose, as one tree:

    SlotswarmError
    ├── UsageError             an argument, message or call the API does not take (also a
    │                          TypeError and a ValueError, what Python code expects of one)
    ├── ConfigError            a session file, flag or workload that does not make sense
    ├── ModelError             a model file that cannot be used
    │   ├── ModelFormatError       corrupt or truncated GGUF, missing tensor or key
    │   └── UnsupportedModelError  another architecture, an unsupported tensor type
    ├── DeviceError            no usable OpenCL device, a kernel that fails to build
    ├── EngineError            the engine refused a step or a KV move (bad Work, no host copy)
    ├── ActorError             something went wrong between actors
    │   ├── ActorCrashed           the actor you were talking to died
    │   ├── UnhandledMessage       the receiver has no handler for that message type
    │   ├── AskTimeout             no reply within the ask's timeout
    │   └── WaitCycle              the ask or lock would close a cycle of waits
    ├── TurnError              a turn ended without finishing
    │   ├── TurnCancelled          cancelled by its agent or the swarm
    │   └── TurnFailed             the engine or its agent failed while it ran
    └── RequestError           an HTTP request `swarm serve` will not serve (carries
                               the status and the OpenAI error type, code and param)

Catch `SlotswarmError` to catch them all. Each carries its context: actor errors
the `agent` (and `reason` for a crash, `chain` for a cycle), turn errors the
`turn`, `agent` and `reason`. `swarm` re-exports the whole tree.
"""


class SlotswarmError(Exception):
    pass


class UsageError(SlotswarmError, TypeError, ValueError):
    pass


class ConfigError(SlotswarmError):
    pass


class ModelError(SlotswarmError):
    pass


class ModelFormatError(ModelError):
    pass


class UnsupportedModelError(ModelError):
    pass


class DeviceError(SlotswarmError):
    pass


class EngineError(SlotswarmError, ValueError):
    pass


class ActorError(SlotswarmError):
    """`agent`: the actor the trouble is with (the one asked, the one that died)."""

    def __init__(self, message: str, *, agent: str | None = None) -> None:
        super().__init__(message)
        self.agent = agent


class ActorCrashed(ActorError):
    """`reason`: its crash ("Type: message"), or None if it was stopped."""

    def __init__(self, message: str, *, agent: str | None = None, reason: str | None = None) -> None:
        super().__init__(message, agent=agent)
        self.reason = reason


class UnhandledMessage(ActorError):
    pass


class AskTimeout(ActorError):
    pass


class WaitCycle(ActorError):
    """`chain`: the agents in the cycle the wait would close, first to last, the
    waiter at both ends."""

    def __init__(self, message: str, *, chain: list[str] | None = None) -> None:
        self.chain = list(chain or [])
        super().__init__(message, agent=self.chain[0] if self.chain else None)


class TurnError(SlotswarmError):
    """`turn`, `agent`: whose turn; `reason`: why it ended, as its event says."""

    def __init__(self, message: str, *, turn: int | None = None, agent: str | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.turn = turn
        self.agent = agent
        self.reason = reason


class TurnCancelled(TurnError):
    pass


class TurnFailed(TurnError):
    pass


class RequestError(SlotswarmError):
    """A request to `swarm serve` that is answered with an OpenAI-style error object."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.code = code
        self.param = param
        self.headers = headers or {}
