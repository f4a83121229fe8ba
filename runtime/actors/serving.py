"""Which part of an actor the running code serves: what a lent priority lifts.

What is lifted is the request, not the whole agent. Every wait names the part of
the holder it waits on (`via`): its mailbox (the handler serving an ask, and any
handler ahead of it) or a lock's critical section ("lock:NAME"). Code running in
such a part carries it in the `serving` context variable (set by the actor system
around each handler and by Lock around its critical section), and only the turns
started there run at the waiters' priority: an agent's own background work keeps
its own. `lift_key(agent, via)` names one part, for the scheduler.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

MAILBOX = "mailbox"  # the part of an actor an ask (or a blocked tell) waits on

# The parts of its actor the running code serves (innermost last): MAILBOX inside
# a handler, "lock:NAME" inside a critical section. Empty in an actor's own run().
serving: ContextVar[tuple[str, ...]] = ContextVar("serving", default=())


def lift_key(agent: str, via: str) -> str:
    """The name under which the scheduler lifts turns started in `via` of `agent`."""
    return f"{agent}/{via}"


@contextmanager
def on_behalf(via: str) -> Iterator[None]:
    """Run the body as serving `via` of the current actor (see the module doc)."""
    token = serving.set((*serving.get(), via))
    try:
        yield
    finally:
        serving.reset(token)
