"""The live event stream: every scheduling decision as one structured record.

Each kind of event is a msgspec Struct below, tagged by its name: the scheduler,
the actor system and the swarm emit them, and the log, the live viewers, the
summary, the plot, the simulator and each turn's own agent `match` on the classes.
Only this module knows the names.

Schema (stable; new optional fields may be added, none removed or renamed). Every
event has `event` (its name), `t` (seconds since the swarm started, virtual in the
simulator) and `step` (the decode step it was decided at). The rest is set where it
means something:

| event               | what happened                          | fields beyond event, t, step              |
|---------------------|----------------------------------------|-------------------------------------------|
| swarm.started       | the swarm is up                        | unix_time, slots, policy, device, model   |
| swarm.stopped       | the swarm is down                      | unix_time                                 |
| turn.queued         | an agent asked for a turn (t: when)    | turn, agent, priority, tokens (prompt)    |
| turn.admitted       | it got a slot for the first time       | turn, agent, priority, slot, waited_s,    |
|                     |                                        | cached_tokens (prompt reused from cache)  |
| turn.preempted      | paused at a token boundary             | turn, agent, priority, slot, tokens,      |
|                     |                                        | by_turn, by_agent, by_priority            |
| turn.resumed        | back in a slot after a pause           | turn, agent, priority, slot, paused_s     |
| turn.progress       | its tokens so far, while it runs       | turn, agent, priority, slot, tokens       |
|                     | (at most once a second, swarm clock)   |                                           |
| turn.finished       | ended normally (eos or max tokens)     | turn, agent, priority, slot, tokens,      |
|                     |                                        | reason ("eos" or "length"), ttft_s, itl_s,|
|                     |                                        | token_s (turns above background),         |
|                     |                                        | cached_tokens (reused over its life),     |
|                     |                                        | computed_tokens (prefilled, recomputed),  |
|                     |                                        | drafted_tokens, accepted_tokens,          |
|                     |                                        | sampling_steps (speculative decoding)     |
| turn.cancelled      | ended by its agent or the swarm        | turn, agent, priority, slot, tokens, reason|
|                     |                                        | ttft_s, itl_s, token_s, cached_tokens,    |
|                     |                                        | computed_tokens, drafted_tokens, ...      |
| turn.failed         | ended by an error                      | turn, agent, priority, slot, tokens, reason|
|                     |                                        | ttft_s, itl_s, token_s, cached_tokens,    |
|                     |                                        | computed_tokens, drafted_tokens, ...      |
| priority.inherited  | an agent runs at a waiter's priority   | agent, priority, base_priority, by_agent  |
| priority.restored   | the wait ended, the priority drops back| agent, priority, base_priority            |
| kv.swapped_out      | a turn's KV moved to host memory       | turn, agent, priority, blocks             |
| kv.swapped_in       | and back to the device                 | turn, agent, priority, slot, blocks       |
| kv.recomputed       | its KV was dropped and is re-prefilled | turn, agent, priority, slot, tokens,      |
|                     |                                        | cached_tokens (reused, not recomputed)    |
| agent.crashed       | an actor died; the swarm goes on       | agent, reason                             |
| step.abandoned      | the step in flight stopped early for a | turns, tokens (its work, run again later),|
|                     | turn that outranks all of it           | by_agent, by_priority                     |
| tool.called         | an agent ran a tool its model called   | agent, tool, duration_s, status ("ok",    |
|                     | (never its arguments or result)        | "error", "timeout" or "unknown")          |

`priority` is always the *effective* priority (base, aged, or inherited) at the time
of the event. `slot` is absent while a turn holds none. On the terminal events,
`ttft_s` is the time from the request to the first token and `itl_s` the mean
time between the turn's later tokens (pauses included); each is absent where the
turn produced too few tokens to have one. A turn above background priority, asked
so or lent it by a waiter (what a person reads), also carries `token_s`, each
token's time from the request (to 0.1 ms), so a log replays the pace its reader
saw, not just the mean.

The bus that carries them to the log and the viewers is `runtime.events.bus`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Union

import msgspec

from runtime.errors import ConfigError


class _Stamp(msgspec.Struct, kw_only=True):
    # Which GPU owner decided it, in a cluster's merged stream (absent with one owner).
    owner: str | None = None


class Event(_Stamp, omit_defaults=True, tag_field="event"):
    """A scheduling decision. Each kind below is tagged by its name, which is the
    JSON `event` field; match on the classes, never on the names."""

    t: float
    step: int

    @property
    def event(self) -> str:
        """The kind's name, as written in the log (for display and filters)."""
        return type(self).__struct_config__.tag


class SwarmStarted(Event, kw_only=True, tag="swarm.started"):
    unix_time: float | None = None
    slots: int | None = None
    policy: str | None = None
    device: str | None = None
    model: str | None = None


class SwarmStopped(Event, kw_only=True, tag="swarm.stopped"):
    unix_time: float | None = None


class TurnEvent(Event):
    """Something that happened to one turn. `slot` is None while it holds none."""

    turn: int
    agent: str
    priority: int
    slot: int | None = None


class Queued(TurnEvent, kw_only=True, tag="turn.queued"):
    tokens: int  # in the prompt


class Admitted(TurnEvent, kw_only=True, tag="turn.admitted"):
    waited_s: float | None = None
    cached_tokens: int = 0  # prompt positions whose K/V came from the prefix cache


class Preempted(TurnEvent, kw_only=True, tag="turn.preempted"):
    """Paused at a token boundary. `by_*` name the turn that took the slot; they
    are None (and `reason` is "memory") when it was paused to free KV memory."""

    tokens: int  # generated before the pause
    by_turn: int | None = None
    by_agent: str | None = None
    by_priority: int | None = None
    reason: str | None = None


class Resumed(TurnEvent, kw_only=True, tag="turn.resumed"):
    paused_s: float


class Progress(TurnEvent, kw_only=True, tag="turn.progress"):
    """How many tokens a running turn has generated so far, so a viewer counts a
    long turn before it ends. Told for the running turns that have new tokens,
    at most once per `PROGRESS_S` of the swarm clock (runtime.scheduling.scheduler), not a
    line per token. Only the log and the viewers get it, not the turn's reader."""

    tokens: int  # generated so far


class Ended(TurnEvent, kw_only=True):
    """Every turn ends in exactly one of the three kinds below."""

    tokens: int
    reason: str
    ttft_s: float | None = None  # request to first token
    itl_s: float | None = None  # mean gap between the later tokens, pauses included
    token_s: list[float] | None = None  # each token's time from the request (turns above background)
    # Positions whose K/V came from the prefix cache over the turn's life: at
    # admission, at a recompute, and blocks a batch-mate computed while it waited.
    cached_tokens: int = 0
    # Positions the engine computed for it other than its decodes (its prompt, and
    # any recompute after its K/V was dropped): with cached_tokens, what the cache saved.
    computed_tokens: int = 0
    # Speculative decoding (runtime.scheduling.drafts): draft tokens its steps
    # verified, how many of them it kept, and the steps that sampled for it
    # (tokens / sampling_steps is its tokens per step).
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    sampling_steps: int = 0


class Finished(Ended, tag="turn.finished"):
    pass  # reason: "eos", "length" or "context"


class Cancelled(Ended, tag="turn.cancelled"):
    pass


class Failed(Ended, tag="turn.failed"):
    pass


class SwappedOut(TurnEvent, kw_only=True, tag="kv.swapped_out"):
    blocks: int


class SwappedIn(TurnEvent, kw_only=True, tag="kv.swapped_in"):
    blocks: int


class Recomputed(TurnEvent, kw_only=True, tag="kv.recomputed"):
    tokens: int  # prefilled again
    cached_tokens: int = 0  # found in the prefix cache instead


class Inherited(Event, kw_only=True, tag="priority.inherited"):
    agent: str
    priority: int
    by_agent: str  # the waiter whose priority it borrows (the chain's origin)
    base_priority: int
    # What the lift serves, e.g. "Review for pair" or "lock tools for pair": only
    # the turns started serving it run at `priority`, not the agent's own work.
    request: str | None = None


class Restored(Event, kw_only=True, tag="priority.restored"):
    agent: str
    priority: int
    base_priority: int


class AgentCrashed(Event, kw_only=True, tag="agent.crashed"):
    agent: str
    reason: str


class StepAbandoned(Event, kw_only=True, tag="step.abandoned"):
    """The step in flight stopped before its end, for an arriving turn above all of
    it (runtime.owner.abandon): its work runs again at a later boundary."""

    turns: int
    tokens: int
    by_agent: str | None = None
    by_priority: int | None = None


class ToolCalled(Event, kw_only=True, tag="tool.called"):
    """An agent ran a tool its model called, between two of its turns. Like a
    prompt, what the tool was given and what it answered stay out of the log."""

    agent: str
    tool: str
    duration_s: float
    status: str  # "ok", "error" (it raised, or the arguments did not fit), "timeout", "unknown" (no such tool)


class Unrecognized(msgspec.Struct):
    """An event of a kind newer than this version, read from a log or a socket:
    kept whole so viewers can pass it on and show its fields plainly."""

    name: str
    t: float
    step: int
    fields: dict[str, Any]

    @property
    def event(self) -> str:
        return self.name


KINDS: tuple[type[Event], ...] = (
    SwarmStarted,
    SwarmStopped,
    Queued,
    Admitted,
    Preempted,
    Resumed,
    Progress,
    Finished,
    Cancelled,
    Failed,
    Inherited,
    Restored,
    SwappedOut,
    SwappedIn,
    Recomputed,
    AgentCrashed,
    StepAbandoned,
    ToolCalled,
)
AnyEvent = Union[KINDS]  # type: ignore[valid-type]  # noqa: UP007 (a union of a tuple built at run time: `|` cannot spell it)
_BY_NAME = {kind.__struct_config__.tag: kind for kind in KINDS}


def kind_named(name: str) -> type[Event]:
    """The class of an event kind, from its name in the log (ConfigError if none)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ConfigError(f"no event kind named {name!r}") from None


def fields_of(event: Event | Unrecognized) -> dict[str, Any]:
    """The fields an event was written with, beyond its name, t and step."""
    if isinstance(event, Unrecognized):
        return dict(event.fields)
    return {k: v for k, v in msgspec.structs.asdict(event).items() if v is not None and k not in ("t", "step")}


def name_matches(event: Event | Unrecognized, patterns: Iterable[str]) -> bool:
    """Whether an event's name matches any pattern: a glob (`turn.*`) if it has
    glob characters, else a prefix (`turn`, `kv.swap`, `turn.preempted`)."""
    name = event.event
    for pattern in patterns:
        is_glob = any(c in pattern for c in "*?[")
        if fnmatch.fnmatchcase(name, pattern) if is_glob else name.startswith(pattern):
            return True
    return False


class Dropped(msgspec.Struct, tag_field="event", tag="events.dropped"):
    """Told to a subscriber in place of the events it lost by falling behind; on
    a live socket, one line of its own. Not an Event: nothing happened."""

    count: int


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Union[(*KINDS, Dropped)])  # type: ignore[valid-type]
_KNOWN = {*_BY_NAME, Dropped.__struct_config__.tag}


class _Header(msgspec.Struct):
    event: str
    t: float
    step: int


def encode(event: Event | Unrecognized | Dropped) -> bytes:
    if isinstance(event, Unrecognized):
        return _encoder.encode({"event": event.name, "t": event.t, "step": event.step, **event.fields})
    return _encoder.encode(event)


def decode(line: bytes | str) -> Event | Unrecognized | Dropped:
    """One JSON line as its event kind (or a viewer's Dropped notice); a kind
    this version does not know comes back as Unrecognized. Raises msgspec's
    DecodeError / ValidationError."""
    try:
        return _decoder.decode(line)
    except msgspec.ValidationError:
        raw = msgspec.json.decode(line)
        if not isinstance(raw, dict) or raw.get("event") in _KNOWN:
            raise  # a known kind with bad fields, or not an event at all
        head = msgspec.convert(raw, _Header)
        rest = {k: v for k, v in raw.items() if k not in ("event", "t", "step")}
        return Unrecognized(head.event, head.t, head.step, rest)


def read_events(path: str | Path) -> Iterator[Event | Unrecognized]:
    """Every event in a JSON-lines file, in order."""
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                yield decode(line)
