"""Constraints compiled by llguidance, over a model's own token table.

llguidance (the library llama.cpp and vLLM use) turns a JSON Schema, a regular
expression, a Lark or GBNF grammar or a list of choices into one grammar, and a
matcher of that grammar tells, token by token, which tokens may come next. Its
tokenizer is built here from the GGUF's vocabulary through gpu.tokenizer, so
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

from gpu.tokenizer import Tokenizer
from runtime.constraints import Choices, Constraint, Grammar, JsonSchema, Regex
from runtime.errors import UsageError

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
    """Implements runtime.constraints.ConstraintChecker for one model; the engine
    asks it for matchers. Safe to use from several threads."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self.vocab_size = vocab_size  # the logits' width: the masks cover it all
        self.eos_ids = sorted(tokenizer.eos_ids)
        self._source = tokenizer
        self._lock = threading.Lock()
        self._grammars: collections.OrderedDict[Constraint, str | UsageError] = collections.OrderedDict()

    @functools.cached_property
    def tokenizer(self) -> llguidance.LLTokenizer:
        # (built on first use: the token table is some 50-250k entries)
        return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_TokenTable(self._source)), n_vocab=self.vocab_size, eos_token=self.eos_ids)

    def check(self, constraint: Constraint) -> None:
        """Compile `constraint` (or find it compiled); UsageError says what is wrong
        with it. Blocks while it compiles: call it off the event loop."""
        self.grammar(constraint)

    def grammar(self, constraint: Constraint) -> str:
        """The constraint as an llguidance grammar, checked against this model's tokens."""
        with self._lock:
            known = self._grammars.get(constraint)
            if known is not None:
                self._grammars.move_to_end(constraint)
        if known is None:
            known = self._compile(constraint)
            with self._lock:
                self._grammars[constraint] = known
                while len(self._grammars) > CACHED:
                    self._grammars.popitem(last=False)
        if isinstance(known, UsageError):
            raise UsageError(str(known))
        return known

    def matcher(self, constraint: Constraint) -> llguidance.LLMatcher:
        """A fresh matcher at the start of the constraint."""
        matcher = llguidance.LLMatcher(self.tokenizer, self.grammar(constraint), log_level=0)
        if matcher.is_error():
            raise UsageError(f"{describe(constraint)}: {one_line(matcher.get_error())}")
        return matcher

    def _compile(self, constraint: Constraint) -> str | UsageError:
        what = describe(constraint)
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
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self.tokenizer)
        if failed:
            return UsageError(f"{what}: {one_line(messages[0]) if messages else 'rejected by the grammar compiler'}")
        return grammar


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


def one_line(message: str) -> str:
    """llguidance's message (which may point at the place over several lines) on one line."""
    return " ".join(line.strip() for line in message.splitlines() if line.strip())
