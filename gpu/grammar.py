"""Constraints compiled by llguidance, over a model's own token table.

llguidance (the library llama.cpp and vLLM use) turns a JSON Schema, a regular
expression, a Lark or GBNF grammar or a list of choices into one grammar, and a
matcher of that grammar tells, token by token, which tokens may come next. Its
tokenizer is built here from the GGUF's vocabulary through gpu.model.tokenizer, so
every catalogue model works without reaching a model hub.

Compiling is cached by the constraint (its text): agents check a constraint
once when they start a turn (in a worker thread: a large schema takes a while),
and the engine then finds it compiled.
"""

from __future__ import annotations

import collections
import functools
import json
import threading

import llguidance
import numpy as np

from gpu.model.tokenizer import Tokenizer
from runtime.errors import UsageError
from runtime.scheduling.constraints import Choices, Constraint, Grammar, JsonSchema, Regex, constraint_problem

CACHED = 256  # compiled constraints kept, the least recently used dropped first
SPECIAL = b"\xff"
# JSON as json.dumps writes it, with no room for whitespace between tokens (a
# schema's own "x-guidance" options may say otherwise): a small model given the
# freedom fills it with blanks.
JSON_OPTIONS = {"whitespace_flexible": False}  # llguidance's mark for a token that is a control token, not text


class _TokenTable:
    """The model's tokenizer in the shape llguidance.LLTokenizer takes."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.eos_token_id = tokenizer.eos_id
        self.bos_token_id = tokenizer.bos_id
        self.special_token_ids = sorted(tokenizer.special_ids)
        self.tokens = [
            SPECIAL + tokenizer.token_bytes(i) if i in tokenizer.special_ids else tokenizer.token_bytes(i)
            for i in range(tokenizer.vocab_size)
        ]
        self._encode = tokenizer.encode

    def __call__(self, text: str | bytes) -> list[int]:
        return self._encode(text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text)


class ConstraintCompiler:
    """Implements runtime.scheduling.constraints.ConstraintChecker for one model; the engine
    asks it for matchers. Safe to use from several threads.

    What is cached is a compiled matcher at the constraint's start (its first
    mask computed, which builds the lexer): a turn's matcher is a copy of it,
    made in a fraction of a millisecond, so the engine's step thread, which
    every stream waits on, never compiles a constraint that was checked (unless
    the cache dropped it since). Compiles run one at a time: a client that
    sends many slow ones takes one core, not all of them."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self.vocab_size = vocab_size  # the logits' width: the masks cover it all
        self.eos_ids = sorted(tokenizer.eos_ids)
        self._source = tokenizer
        self._lock = threading.Lock()
        self._compiling = threading.Lock()
        self._compiled: collections.OrderedDict[Constraint, llguidance.LLMatcher | UsageError] = collections.OrderedDict()
        self.built = 0  # matchers compiled from a grammar (tests: a turn's is a copy)

    def __len__(self) -> int:
        return len(self._compiled)

    @functools.cached_property
    def tokenizer(self) -> llguidance.LLTokenizer:
        # (built on first use: the token table is some 50-250k entries)
        return llguidance.LLTokenizer(
            llguidance.TokenizerWrapper(_TokenTable(self._source)), n_vocab=self.vocab_size, eos_token=self.eos_ids
        )

    def check(self, constraint: Constraint) -> None:
        """Compile `constraint` (or find it compiled); UsageError says what is wrong
        with it. Blocks while it compiles, and while another compile runs: call it
        off the event loop."""
        if self._cached(constraint) is None:
            with self._compiling:
                self._prototype(constraint)

    def compiled(self, constraint: Constraint) -> bool:
        """Whether `check` would find the constraint compiled (or refused)."""
        with self._lock:
            return constraint in self._compiled

    def matcher(self, constraint: Constraint) -> llguidance.LLMatcher:
        """A fresh matcher at the start of the constraint."""
        return self._prototype(constraint).deep_copy()

    def _cached(self, constraint: Constraint) -> llguidance.LLMatcher | UsageError | None:
        with self._lock:
            known = self._compiled.get(constraint)
            if known is not None:
                self._compiled.move_to_end(constraint)
        return known

    def _prototype(self, constraint: Constraint) -> llguidance.LLMatcher:
        known = self._cached(constraint)
        if known is None:
            known = self._compile(constraint)
            with self._lock:
                self._compiled[constraint] = known
                while len(self._compiled) > CACHED:
                    self._compiled.popitem(last=False)
        if isinstance(known, UsageError):
            raise UsageError(str(known))
        return known

    def _compile(self, constraint: Constraint) -> llguidance.LLMatcher | UsageError:
        what = describe(constraint)
        if (problem := constraint_problem(constraint)) is not None:  # (one sent past the agents' check)
            return UsageError(problem)
        try:
            match constraint:
                case JsonSchema(schema=schema):
                    try:
                        parsed = json.loads(schema)
                    except ValueError as exc:
                        return UsageError(f"{what} is not valid JSON: {exc}")
                    if not isinstance(parsed, (dict, bool)):
                        return UsageError(f"{what} must be a JSON object (or true/false), not {type(parsed).__name__}")
                    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
                case Regex(pattern=pattern):
                    grammar = llguidance.LLMatcher.grammar_from_regex(pattern)
                case Grammar(text=text, syntax=syntax):
                    grammar = llguidance.grammar_from(syntax, text)
                case Choices(options=options):
                    grammar = llguidance.grammar_from("choice", json.dumps(list(options)))
                case _:
                    return UsageError(f"not a constraint: {constraint!r}")
        except ValueError as exc:
            return UsageError(f"{what}: {one_line(str(exc))}")
        except RecursionError:
            return UsageError(f"{what} nests too deeply")
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self.tokenizer)
        if failed:
            return UsageError(f"{what}: {one_line(messages[0]) if messages else 'rejected by the grammar compiler'}")
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        self.built += 1
        if matcher.is_error():
            return UsageError(f"{what}: {short_error(matcher.get_error())}")
        # The first mask builds the lexer (the copies share it), and says
        # whether the constraint allows anything at all.
        first = np.zeros((self.vocab_size + 31) // 32, np.int32)
        matcher.unsafe_compute_mask_ptr(first.ctypes.data, first.nbytes)
        if matcher.is_error() or not first.any():
            why = f" ({short_error(matcher.get_error())})" if matcher.is_error() else ""
            return UsageError(f"{what} matches nothing: no token of this model may start it{why}")
        return matcher


def describe(constraint: Constraint) -> str:
    """The constraint in a few words, for an error message."""
    match constraint:
        case JsonSchema():
            return "the JSON schema"
        case Regex(pattern=pattern):
            return f"the regex {pattern[:60]!r}"
        case Grammar(syntax=syntax):
            return f"the {syntax} grammar"
        case Choices():
            return "the choices"
    return "the constraint"


def short_error(error: str) -> str:
    """llguidance's error on one line, without the parser state it appends."""
    return one_line(error.split("<state>")[0].split("<backtrace>")[0]).rstrip(" :")


def one_line(message: str) -> str:
    """llguidance's message (which may point at the place over several lines) on one line."""
    return " ".join(line.strip() for line in message.splitlines() if line.strip())
