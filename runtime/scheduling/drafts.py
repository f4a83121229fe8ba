"""Speculative decoding's drafts: guessed by prompt lookup or a draft model,
verified exactly.

**Drafts.** A turn's next tokens are often a copy of tokens it has already
seen: an edited function repeats the function it was given, a test repeats the
names of the code. Prompt lookup (as vLLM's n-gram speculator) finds the last
time the turn's most recent n tokens appeared before (n from `LONGEST` down to
`SHORTEST`, the longest match first, its most recent occurrence) and proposes
the tokens that followed it there. While a copy keeps matching it is followed past
what a later occurrence of its last few tokens says, and past one token that
breaks a long run of it (a renamed word: `RESYNC`), which it then renames
wherever the copy has it. `Lookup` keeps, per turn, where each n-gram
last ended, and is fed the turn's tokens as they are settled; `propose` is the
same search written plainly, for the tests.

**Drafts from a draft model** (`Speculate.DRAFT`): a smaller model with the
same tokenizer (qwen2.5-coder-0.5b for the 1.5B) decodes k tokens greedily
from the turn's tokens, and those are the drafts. The scheduler decides here,
as for lookup, whether and how many (k); but the drafts themselves take device
work, which has no place in a plain synchronous scheduler nor on the event
loop. So the plan's verify work holds k `work.TO_DRAFT` placeholders and the
turn's tokens the draft model has not been told yet (`Work.context`), and the
owner's draft model part (runtime.owner.drafter.DraftModel, given to the owner
beside its engine) writes the drafts in the step thread, right before the
verify step runs, in device order with every other step, into the copy of the
work that runs; they come back with the step's tokens, as results. It keeps each turn's
K/V on its own engine (its own KV cache, its blocks its own), catches up on the
tokens the turn kept since it last drafted, rolls back by length what the
target refused (its K/V past the last token both agree on is simply written
again), and lets go of a turn's K/V when the turn ends. The proof below does not
care where drafts come from: any draft is kept exactly when it is the token the
turn samples anyway.

**Verification.** A speculating turn's step feeds [its last sampled token, d1
.. dk] at positions p .. p+k and samples a token at every one of those rows
(`Work.drafts`): row i's token t_{i+1} is what the turn would sample at
position p+i+1 had d1..di been its tokens, drawn exactly as a step without
drafts draws it (greedy: the argmax; at a temperature: gpu.sampling's draw
with the turn's seed and that position).

**Acceptance** (`accept`) keeps d1, d2, ... while each equals the token sampled
at its position, and at the first mismatch keeps the sampled token instead and
stops; if all k are kept, t_{k+1} is kept too. So a verify step yields 1 to
k+1 tokens.

Why this is exact. By induction over the rows: if the tokens kept so far are
the ones the turn would have sampled without drafts, the next row's logits are
computed over exactly those tokens (the rows before it in the step are the
kept drafts), so its sampled token t is the token the turn would sample there
without drafts: same logits, same (seed, position) draw. Keeping t (whether it
equals the draft or replaces it) keeps the invariant; stopping after a mismatch
throws away only rows computed over a wrong token. So a speculating turn emits
EXACTLY the tokens it emits without speculation, greedy or sampled, with the
same (seed, position) determinism: the distribution is preserved trivially.
This is the rejection-sampling rule for a one-hot draft distribution q (accept
x with probability min(1, p(x)/q(x)) = p(x), else draw from p with x removed),
coupled with the non-speculative draw: the draw u picks x exactly when it would
have picked x, with probability p(x), and otherwise picks from the rest in
proportion to p. (The logits of a row are the engine's; the engines compute a
row the same whatever else the step holds, docs/design.md, so "same logits"
holds as exactly as a paused turn's resumption does.)

K/V written at rejected positions is past the turn's accepted length: attention
only reads positions below a row's own, and the next step writes those
positions again before anything reads them, so nothing needs undoing.

A constrained turn (Work.constraint) never speculates: its mask at each row
would need the grammar advanced over the drafts, which is not worth it.

**Who speculates** (`Speculation`): only a turn the step is built for (the
foreground in a shaped step) or one running alone, where the step cost law
(runtime.scheduling.cost) says the extra rows pay: the k that maximises the
expected tokens per second, E[kept](k) / step_s(k), with E[kept](k) = 1 + a1 +
a1 a2 + .. + a1 .. ak, where ai is the turn's acceptance rate so far of a
guess that follows a copy which has matched r + i - 1 tokens, r being the run
of the copy lookup proposes from (`Rates`: a 4-gram's continuation is far
likelier right than a single token's, and a copy kept for 30 tokens likelier
still: a copy is kept or broken as a run, so a draft deep in a kept run is
likelier kept than a first one, and one rate for every draft would undervalue
long drafts), or the draft model's own rate (`MODEL`). A draft
model's k drafts also cost k of its own steps, the first of them reading what
the turn kept since it last drafted (`DraftCost`, from the draft engine's own
cost law), so on a CPU, where its step is a good share of the target's and
every verified row costs a token's compute, only a high rate pays, if any. The
first time a turn drafts, the draft model also reads the turn's context (a
prefill); each step is charged its share of that by the tokens it yields. On a GPU the rows are nearly free and every likely
draft pays; on a CPU each row costs a token's compute and only long, likely
matches do. The rates learn from every token such a turn samples, drafted or
not: each is checked against the guess lookup had for it, so a turn that does
not speculate still learns whether it would pay, at no device cost. (Not a draft model's: its guesses cost a step
each, so its rate learns only from the drafts it verifies.)
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from runtime.errors import ConfigError
from runtime.scheduling.cost import StepCost, kv_reads

LONGEST = 4  # the longest n-gram looked up
SHORTEST = 1  # the shortest
LONGEST_RUN = 64  # the longest run of a copy with a rate of its own (longer ones share it)
# Lookup indexes at most this many of a turn's tokens it is first given (the
# latest): the scheduler builds the index on the event loop, so its first cost
# is bounded however long the prompt.
LOOKBACK = 4096
MAX_DRAFTS = 16  # drafts a verify step holds at most (the step cost law decides how many pay)
PRIOR_RATE = 0.5  # a turn's acceptance rate before anything is known of it
PRIOR_WEIGHT = 4.0  # how many drafts the prior weighs as
MEMORY = 32.0  # drafts the rate remembers (older ones weigh less)
MODEL = -1  # the draft model's rate among a turn's `Rates` (runs are 1 and up)
RESYNC = -2  # lookup's guess past a token it guessed was replaced, among a turn's `Rates`
# A draft model of the target's family agrees with it far more often than an
# untested n-gram does: its rate starts here.
MODEL_PRIOR_RATE = 0.75


class Speculate(enum.StrEnum):
    OFF = "off"
    LOOKUP = "lookup"  # drafts by prompt lookup
    DRAFT = "draft"  # drafts by a draft model ("draft:MODEL" names it)

    @classmethod
    def parse(cls, name: str | Speculate) -> Speculate:
        return split_speculation(name)[0]


def split_speculation(text: str | Speculate) -> tuple[Speculate, str | None]:
    """The kind a speculation knob names ("off", "lookup", "draft" or
    "draft:MODEL"), and the draft model it names (None: the default for the
    target, or none)."""
    if isinstance(text, Speculate):
        return text, None
    kind, _, model = str(text).partition(":")
    try:
        speculate = Speculate(kind)
    except ValueError:
        choices = ", ".join(s.value for s in Speculate)
        raise ConfigError(f"unknown speculation {text!r}; choose from {choices} or draft:MODEL") from None
    if ":" in str(text) and (speculate is not Speculate.DRAFT or not model):
        raise ConfigError(f"speculation {text!r}: only draft takes a model, as draft:MODEL")
    return speculate, model or None


def propose(tokens: Sequence[int], k: int, longest: int = LONGEST, shortest: int = SHORTEST) -> list[int]:
    """`proposal`'s drafts."""
    return proposal(tokens, k, longest, shortest)[0]


def proposal(tokens: Sequence[int], k: int, longest: int = LONGEST, shortest: int = SHORTEST) -> tuple[list[int], int]:
    """Up to k tokens that follow where `tokens` copy from, and the length of
    the run of that copy they end (RESYNC: a copy past a replaced token; 0:
    none): `Lookup`'s rule, written plainly. The copy followed is taken,
    after each token, from the most recent earlier occurrence of the longest
    suffix of the tokens so far (of `longest` down to `shortest` tokens) that
    occurred before, unless the copy followed until then matches at least as
    many; a token it replaced, once the copy went on after it, is replaced
    wherever the copy has it, until a copy keeps it."""
    source, run, resyncing, renamed, replaced = -1, 0, False, {}, (0, 0)
    for end in range(1, len(tokens) + 1):
        token = tokens[end - 1]
        original = tokens[source] if source >= 0 else None
        if source >= 0 and renamed.get(original, original) == token:
            if resyncing:
                renamed[replaced[0]] = replaced[1]
            source, run, resyncing = source + 1, run + 1, False
        elif source >= 0 and original == token:  # (a copy that keeps a token renamed before)
            del renamed[original]
            source, run, resyncing = source + 1, run + 1, False
        elif source >= 0 and not resyncing and run >= longest:
            source, resyncing, replaced = source + 1, True, (original, token)
        else:
            source, run, resyncing = -1, 0, False
        for n in range(min(longest, end - 1), shortest - 1, -1):
            suffix = list(tokens[end - n : end])
            at = next((e for e in range(end - 1, n - 1, -1) if list(tokens[e - n : e]) == suffix), -1)
            if at >= 0:
                if source < 0 or (n >= longest if resyncing else n > run):
                    source, run, resyncing = at, n, False
                break
    if source < 0:
        return [], 0
    return [renamed.get(t, t) for t in tokens[source : source + k]], RESYNC if resyncing else run


def accept(drafts: Sequence[int], sampled: Sequence[int]) -> list[int]:
    """The tokens a verify step yields: `sampled` holds the token sampled at
    each of its len(drafts) + 1 rows. The drafts kept, then the sampled token
    at the first mismatch (or after the last draft)."""
    assert len(sampled) == len(drafts) + 1, "a verify step samples one row per draft, and one more"
    kept = []
    for draft, token in zip(drafts, sampled, strict=False):
        kept.append(token)
        if token != draft:
            return kept
    kept.append(sampled[-1])
    return kept


def expected_kept(rate: float | Sequence[float], k: int) -> float:
    """Tokens a verify step of k drafts yields on average, draft i kept with
    probability rate[i] given the ones before it were (a float: the same at
    every depth, 1 + rate + .. + rate^k): 1 + r1 + r1 r2 + .. + r1 .. rk."""
    total = run = 1.0
    for i in range(k):
        run *= rate if isinstance(rate, float | int) else rate[i]
        total += run
    return total


class Lookup:
    """A turn's n-gram index: where each n-gram (n = shortest .. longest) last
    ended in its tokens, fed as they are settled; and the copy they follow.

    The copy followed (`source`: where the token expected next is) is the
    most recent earlier occurrence of the longest suffix that occurred before,
    as vLLM's n-gram speculator picks it, with two differences that matter
    where a turn copies a long text with a few changes (an edited function):
    a copy that keeps matching is kept while no longer match is found
    elsewhere (its match is as long as the run it has kept, not just the
    n-gram's: a later line that shares the last few tokens does not take
    over); and when a run of at least `longest` tokens breaks, lookup guesses
    that one token was replaced and the copy goes on after it (`RESYNC`, its
    own rate: a renamed word), dropped if the next token disagrees too. Once
    the copy went on after it, the token it replaced is replaced wherever a
    copy has it (`renamed`: an edit renames a variable everywhere), until a
    copy keeps it."""

    def __init__(self, longest: int = LONGEST, shortest: int = SHORTEST) -> None:
        self.longest, self.shortest = longest, shortest
        self.tokens: list[int] = []  # the tokens indexed
        self.fed = 0  # the turn's tokens given so far (the first fed - len(tokens) skipped: LOOKBACK)
        # n-gram -> the end (exclusive) of its latest occurrence but the last
        # one, and of its latest: the suffix's own is never its match.
        self._ends: dict[tuple[int, ...], tuple[int, int]] = {}
        self.source = -1  # where in `tokens` the copy followed expects the next token (-1: none)
        self.run = 0  # the tokens it has matched in a row
        self.resyncing = False  # past a token it guessed was replaced
        self._replaced = (0, 0)  # (that token, and the one written instead)
        self.renamed: dict[int, int] = {}  # tokens a copy replaced and went on after, each by what replaced it

    def extend(self, tokens: Sequence[int]) -> None:
        """Index these tokens, which follow those given before (the first time,
        only the last LOOKBACK of them)."""
        self.fed += len(tokens)
        if not self.tokens and len(tokens) > LOOKBACK:
            tokens = tokens[len(tokens) - LOOKBACK :]
        seen, ends = self.tokens, self._ends
        longest, shortest = self.longest, self.shortest
        for token in tokens:
            self._follow(token)
            seen.append(token)
            end = len(seen)
            match, at = 0, -1  # the longest suffix that occurred before, and where that ended
            for n in range(shortest, min(longest, end) + 1):
                gram = tuple(seen[end - n :])
                before = ends.get(gram)
                if before is not None:
                    match, at = n, before[1]
                ends[gram] = (before[1] if before is not None else -1, end)
            if match and (self.source < 0 or (match >= longest if self.resyncing else match > self.run)):
                self.source, self.run, self.resyncing = at, match, False

    def _follow(self, token: int) -> None:
        """The copy followed, given the token that comes next."""
        source = self.source
        if source < 0:
            return
        original = self.tokens[source]
        renamed = self.renamed
        if renamed.get(original, original) == token:
            if self.resyncing:  # (the copy went on after the token it replaced: a rename)
                renamed[self._replaced[0]] = self._replaced[1]
            self.source, self.run, self.resyncing = source + 1, self.run + 1, False
        elif original == token:  # (a copy that keeps a token renamed before: not renamed here)
            del renamed[original]
            self.source, self.run, self.resyncing = source + 1, self.run + 1, False
        elif not self.resyncing and self.run >= self.longest:
            self.source, self.resyncing, self._replaced = source + 1, True, (original, token)
        else:
            self.source, self.run, self.resyncing = -1, 0, False

    def propose(self, k: int) -> list[int]:
        """`propose(tokens, k)` over the tokens indexed."""
        return self.proposal(k)[0]

    def proposal(self, k: int) -> tuple[list[int], int]:
        """`proposal(tokens, k)` over the tokens indexed."""
        if self.source < 0:
            return [], 0
        drafts = self.tokens[self.source : self.source + k]
        if self.renamed:
            drafts = [self.renamed.get(t, t) for t in drafts]
        return drafts, RESYNC if self.resyncing else self.run


class Rates:
    """A turn's acceptance rates: of lookup's guess for the next token, one per
    length of the run its copy has matched (`run_class`), and one for a guess
    past a replaced token (RESYNC); of the draft model's drafts (MODEL); the
    match its drafts in flight follow; and the match its last token was
    guessed from, with how many tokens lookup offered there (0: none: then it
    likely has nothing to draft from next either, and no step waits for it).

    Why the run. A copy is kept or broken as a run: a draft that follows a
    copy which has matched r tokens, once kept, leaves one that has matched
    r + 1, which is likelier kept still. So the rate of draft i of a step is
    that of a run of r + i - 1 (`chain`), and a long copy is priced as the
    turn has kept long copies, not as k independent guesses at the rate of
    the first. A match length not noted yet is priced as the shorter one,
    and a class of runs longer than LONGEST by the run's own length
    (`_prior`)."""

    def __init__(self) -> None:
        # A key's rate is made when first noted: until then it is the prior,
        # and most turns never draft (every turn has its Rates).
        self.by_key: dict[int, Rate] = {}
        self.drafting = 0
        self.matched = 0
        self.offered = 0

    def of(self, match: int) -> float:
        """The rate of a guess following a run of `match` tokens (RESYNC: past
        a replaced token; MODEL: the draft model's)."""
        key = run_class(match)
        rate = self.by_key.get(key)
        return rate.value if rate is not None else self._prior(key)

    def chain(self, match: int, k: int) -> list[float]:
        """The rate of each of k drafts following a match of `match` tokens,
        given the ones before it were kept."""
        if match == MODEL:
            return [self.of(MODEL)] * k
        if match == RESYNC:  # (kept, it continues a run of at least LONGEST)
            return [self.of(RESYNC), *(self.of(LONGEST + i) for i in range(1, k))][:k]
        return [self.of(match + i) for i in range(k)]

    def note(self, match: int, tried: int, kept: int) -> None:
        """`kept` of `tried` guesses following a match of `match` tokens were kept (or would have been)."""
        key = run_class(match)
        rate = self.by_key.get(key)
        if rate is None:
            rate = self.by_key[key] = Rate(self._prior(key))
        rate.note(tried, kept)

    def _prior(self, key: int) -> float:
        if key == MODEL:
            return MODEL_PRIOR_RATE
        if key == RESYNC or key <= SHORTEST:
            return PRIOR_RATE
        if key <= LONGEST:  # (no likelier than the shorter match, as far as the turn has shown)
            return self.of(key - 1)
        # A run past its n-gram has kept its last key - LONGEST guesses (at
        # most) in a row: before the turn has kept or broken runs that long,
        # the next is kept as Laplace's rule of succession says, and no less
        # likely than after a shorter run.
        kept = key - LONGEST
        return max(self.of(key // 2), (kept + 1) / (kept + 2))


def run_class(match: int) -> int:
    """The class of a run's length whose rate it shares: each up to LONGEST
    its own, then the powers of two up to LONGEST_RUN (a long run's rate
    learns from runs about as long); keys below 1 (RESYNC, MODEL) as they are."""
    if match <= LONGEST:
        if match < SHORTEST and match not in (RESYNC, MODEL):
            raise KeyError(match)
        return match
    return min(1 << (match - 1).bit_length(), LONGEST_RUN)


class Rate:
    """A turn's acceptance so far: the share of its drafts kept (or that would
    have been), the older weighing less, starting from PRIOR_RATE."""

    def __init__(self, prior: float = PRIOR_RATE) -> None:
        self.kept = prior * PRIOR_WEIGHT
        self.drafted = PRIOR_WEIGHT

    @property
    def value(self) -> float:
        return self.kept / self.drafted

    def note(self, tried: int, kept: int) -> None:
        """`kept` of `tried` drafts put to the test were kept (or would have been)."""
        fade = max(0.0, 1 - tried / MEMORY)
        self.kept = self.kept * fade + kept
        self.drafted = self.drafted * fade + tried


def drafts_that_pay(
    cost: StepCost,
    rate: float | Sequence[float],
    most: int,
    tokens: int,
    kv: int,
    start: int,
    draft: DraftCost | None = None,
) -> int:
    """How many drafts (0 .. most) a decode at position `start` should verify:
    the number that maximises the expected tokens per second of the step, whose
    other work is `tokens` tokens reading `kv` KV positions, and, where a draft
    model makes the drafts, what making them costs (`draft`); `rate` is as
    `expected_kept`'s (per depth: at least `most` of them). Ties go to fewer."""
    best, best_k = 0.0, 0
    kept = run = 1.0
    for k in range(most + 1):
        if k:
            run *= rate if isinstance(rate, float | int) else rate[k - 1]
            kept += run
        step_s = cost.predict(tokens + 1 + k, kv + kv_reads(start, 1 + k))
        if k and draft is not None:
            step_s += draft.seconds(k, kept)
        pace = kept / step_s if step_s > 0 else float(k)
        if pace > best * (1 + 1e-9):
            best, best_k = pace, k
    return best_k


class DraftCost:
    """What a draft model's k drafts cost a verify step: its first step reads
    the tokens it was not told yet (`catch_up_s`: the tokens the turn kept since
    it last drafted, and its last one), each further draft one step
    (`step_s`); the first time a turn drafts, the draft model also reads the
    turn's context (`once_s`), which serves all its later steps: each is
    charged the share of it in proportion to the tokens it is expected to
    yield, out of the `remaining` the turn may still decode."""

    def __init__(self, step_s: float, catch_up_s: float, once_s: float = 0.0, remaining: int = 1) -> None:
        self.step_s, self.catch_up_s = step_s, catch_up_s
        self.once_s, self.remaining = once_s, max(1, remaining)

    def seconds(self, k: int, kept: float) -> float:
        return self.catch_up_s + (k - 1) * self.step_s + self.once_s * min(1.0, kept / self.remaining)
