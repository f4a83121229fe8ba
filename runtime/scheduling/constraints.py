"""What a turn's output may be: a constraint its decoding is held to.

A turn may carry one of four (a tagged union, so it crosses actor and process
boundaries like any message):

    JsonSchema(schema)          JSON that validates against a JSON Schema (its JSON text)
    Regex(pattern)              text that matches a regular expression (whole)
    Grammar(text, syntax)       text a context-free grammar derives (Lark or GBNF)
    Choices(options)            exactly one of a few strings

The engine holds the turn to it token by token (gpu.grammar compiles it and
gpu.masks keeps each turn's place in it); an engine that cannot constrain says
so with `Engine.constraints` None. `TurnConstraint` is what the scheduler gives
the engine with each piece of a constrained turn's work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import anyio
import msgspec
from anyio.lowlevel import RunVar

from runtime.errors import UsageError


class JsonSchema(msgspec.Struct, tag="json_schema", frozen=True):
    schema: str  # the schema's JSON text


class Regex(msgspec.Struct, tag="regex", frozen=True):
    pattern: str


class Grammar(msgspec.Struct, tag="grammar", frozen=True):
    text: str
    syntax: Literal["lark", "gbnf"] = "lark"


class Choices(msgspec.Struct, tag="choices", frozen=True):
    options: tuple[str, ...]


Constraint = JsonSchema | Regex | Grammar | Choices
CONSTRAINTS = (JsonSchema, Regex, Grammar, Choices)

# The most characters a constraint's text may have. Compiling grows faster than
# the text (100,000 choices take tens of seconds of a core), and a compile cannot
# be stopped once begun: the size is what keeps its time bounded. 128 tools with
# a schema of a few properties each come to a fifth of it.
MAX_CONSTRAINT_CHARS = 256 * 1024


def constraint_problem(constraint: object) -> str | None:
    """Why this is not a well-formed constraint (its types), or None. Whether its
    schema or grammar means anything is the engine's to say (ConstraintChecker)."""
    if constraint is None:
        return None
    if not isinstance(constraint, CONSTRAINTS):
        return f"constraint must be a JsonSchema, Regex, Grammar or Choices, got {type(constraint).__name__}"
    match constraint:
        case JsonSchema(schema=schema) if not isinstance(schema, str):
            return f"JsonSchema.schema must be the schema's JSON text (a str), got {type(schema).__name__}"
        case Regex(pattern=pattern) if not isinstance(pattern, str):
            return f"Regex.pattern must be a str, got {type(pattern).__name__}"
        case Grammar(text=text, syntax=syntax) if not isinstance(text, str) or syntax not in ("lark", "gbnf"):
            return f"Grammar needs a str text and syntax 'lark' or 'gbnf', got {type(text).__name__} and {syntax!r}"
        case Choices(options=options) if (
            not isinstance(options, (tuple, list)) or not options or not all(isinstance(o, str) and o for o in options)
        ):
            return "Choices.options must be one or more non-empty strs"
    if (size := _size(constraint)) > MAX_CONSTRAINT_CHARS:
        return f"the constraint is {size} characters long; at most {MAX_CONSTRAINT_CHARS} are taken (compiling it would take too long)"
    return None


def _size(constraint: Constraint) -> int:
    match constraint:
        case JsonSchema(schema=text) | Regex(pattern=text) | Grammar(text=text):
            return len(text)
        case Choices(options=options):
            return sum(len(o) + 1 for o in options)
    return 0


class ConstraintChecker(Protocol):
    """What an engine offers the agents' side: `check` compiles a constraint (and
    caches it, by its text) and raises UsageError naming what is wrong with it.
    It blocks for as long as compiling takes: call it off the event loop.
    `compiled` says, at once, whether `check` would find it compiled."""

    def check(self, constraint: Constraint) -> None: ...

    def compiled(self, constraint: Constraint) -> bool: ...


# One compile at a time in each event loop: a client that sends many slow ones
# takes one worker thread and one core, never the threads and cores the rest of
# the swarm needs; one waiting for its turn waits here, where it can be cancelled.
_compiling: RunVar[anyio.CapacityLimiter] = RunVar("slotswarm_compiling")


def _compile_limiter() -> anyio.CapacityLimiter:
    try:
        return _compiling.get()
    except LookupError:
        _compiling.set(limiter := anyio.CapacityLimiter(1))
        return limiter


async def check_constraint(checker: ConstraintChecker | None, constraint: Constraint | None) -> None:
    """Raise UsageError if `constraint` is malformed, or is one the engine behind
    `checker` cannot hold a turn to (compiled in a worker thread, off the loop).
    Called before a turn is queued, so a bad one never reaches the owner."""
    if constraint is None:
        return
    if (problem := constraint_problem(constraint)) is not None:
        raise UsageError(problem)
    if checker is None:
        raise UsageError("this engine cannot constrain a turn's output (it has no vocabulary)")
    if checker.compiled(constraint):  # (found at once: no waiting behind another's compile)
        checker.check(constraint)
        return
    await anyio.to_thread.run_sync(checker.check, constraint, limiter=_compile_limiter())


@dataclass(frozen=True, eq=False)
class TurnConstraint:
    """A constrained turn, as the engine sees it in each `Work`: the constraint,
    the position its output starts at (a turn moved from another owner brings the
    output it made there at its prompt's end: the constraint has been followed
    that far), and a view of the turn's tokens, so an engine that has lost its
    place in the constraint (the turn was recomputed, moved, or a step of it
    abandoned) can find it again from the tokens alone."""

    constraint: Constraint
    start: int  # the position of the first constrained token
    tokens: Callable[[int, int], list[int]]  # the turn's tokens at positions [a, b), every one known
