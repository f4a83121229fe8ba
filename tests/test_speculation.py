"""Speculative decoding end to end (runtime.scheduling.drafts): a turn that
verifies drafts emits exactly what it emits without them, greedy or sampled,
through the scheduler (in order, one step ahead, with preemptions under every
policy while a verify step is in flight), the owner, and the real OpenCL engine.

Exactness is checked as identity: the design makes a speculating turn's tokens
the very tokens it samples without drafts (the argument is in drafts.py), so a
distribution test reduces to it; one is run all the same, on sampled turns."""

from __future__ import annotations

from collections import Counter

import anyio
import msgspec
import numpy as np
import pytest
from kv_engine import EOS, KVEngine, reference_output

from gpu.engine import OpenCLEngine
from runtime.agent import Agent
from runtime.events.kinds import Ended, Event, Queued
from runtime.scheduling.blocks import BlockPool
from runtime.scheduling.cost import StepCost
from runtime.scheduling.priority import BACKGROUND, FOREGROUND
from runtime.scheduling.scheduler import Scheduler
from runtime.scheduling.timing import TimingEngine, TimingModel
from runtime.scheduling.turns import Policy, SchedulerConfig
from runtime.scheduling.work import Work
from swarm import Swarm

VOCAB, WINDOW = 12, 2  # a token is a hash of the last two: sequences repeat, and drafts are often right


def drive(
    sched: Scheduler,
    engine,
    *,
    ahead: bool,
    arrive_at: dict | None = None,
    while_verifying: list | None = None,
    abandon: int = 0,
    abandon_from: int = 0,
) -> int:
    """Run every turn to its end, in order or one step ahead as the owner does
    (landing a step whose plan says `settle` before planning the next, as the
    owner does). `arrive_at` submits turns at boundaries; `while_verifying`
    submits one at each boundary where a verify step is in flight (one step
    ahead), which is then not landed first: the new turn is admitted, and may
    preempt the verifying one, while its verify step flies. `abandon` verify
    steps in flight are abandoned (runtime.owner.abandon: they count for
    nothing). Returns the steps run."""
    arrive_at, while_verifying = arrive_at or {}, list(while_verifying or [])
    now, boundary, flight, sampled, steps = 0.0, 0, None, {}, 0

    def land() -> None:
        nonlocal flight
        if flight is not None:
            sched.postprocess(flight[0], flight[1], now, drafted=flight[2])
            flight = None

    while sched.turns or flight or any(b >= boundary for b in arrive_at) or (while_verifying and sched.turns):
        boundary += 1
        assert boundary < 10_000, "the turns never end"
        now += 0.01
        verifying = flight is not None and any(w.drafts for w in flight[0].works)
        if verifying and abandon_from:
            abandon_from -= 1
            land()
        elif verifying and abandon:
            sched.discard(flight[0])
            flight, abandon = None, abandon - 1
        elif verifying and while_verifying:
            sched.submit(*while_verifying.pop(0), now)
        elif flight is not None and flight[0].settle:
            land()
        for args in arrive_at.get(boundary, []):
            sched.submit(*args, now)
        plan = sched.schedule(now)
        if plan.moves:
            land()
            for move in plan.moves:
                move.apply(engine)
            sched.settle_moves(plan, {}, now)
        if not plan.works:
            land()
            continue
        steps += 1
        if not ahead:
            tokens = engine.step(plan.works)
            sched.postprocess(plan, tokens, now, drafted=getattr(engine, "drafted", None))  # (a draft model's: test_draft_model)
            continue
        sched.advance(plan)
        works = [given(w, sampled[w.turn]) if w.follows else w for w in plan.works]
        assert not any(w.drafts and w.follows for w in works), "drafts follow a known last token"
        tokens = engine.step(works)
        sampled = {w.turn: t for w, t in zip(works, tokens, strict=False) if w.sample and not w.drafts}
        land()
        flight = (plan, tokens, getattr(engine, "drafted", None))
    return steps


def given(work: Work, token: int) -> Work:
    """A decode planned on a token not sampled yet, given it (in a copy, as StepInFlight.hand_over does)."""
    return msgspec.structs.replace(work, tokens=[*work.tokens[:-1], token], follows=False)


def noting_verifying(sched: Scheduler, notes: list[bool]):
    """The scheduler's own preempt, noting whether the victim had a verify step in flight."""
    preempt = sched.preempt

    def note_preempt(victim, *args, **kw):
        notes.append(sched.in_flight.of(victim).verifying > 0)
        preempt(victim, *args, **kw)

    return note_preempt


def prompt(i: int) -> list[int]:
    return [3 + (5 * i + j) % (VOCAB - 3) for j in range(2 + i % 5)]


@pytest.mark.parametrize("policy", [Policy.RESIDENT, Policy.SWAP, Policy.RECOMPUTE])
@pytest.mark.parametrize("way", ["in-order", "ahead", "ahead-while-verifying"])
def test_turns_that_speculate_say_what_they_say_without_drafts_through_preemptions(policy, way):
    """One slot: a background turn runs alone and speculates; foreground turns
    arrive and pause it, under every preempting policy; with
    `ahead-while-verifying` each arrives while its verify step flies, one step
    ahead, and pauses it before that step lands."""
    outputs, drafted = [], []
    for speculate in ("off", "lookup"):
        engine = KVEngine(num_blocks=24, block_size=4, vocab=VOCAB, window=WINDOW, eos_every=40)
        events: list[Event] = []
        config = SchedulerConfig(slots=1, policy=policy, step_tokens=16, speculate=speculate, max_drafts=5)
        sched = Scheduler(config, BlockPool(24, 4), eos_token_ids={EOS}, emit=events.append)
        paused_verifying: list[bool] = []
        sched.preempt = noting_verifying(sched, paused_verifying)
        turns = [sched.submit(f"bg{i}", BACKGROUND, prompt(i), 20 + 7 * i, 0.0, ignore_eos=i % 2 == 0) for i in range(3)]
        late = [(f"fg{b}", FOREGROUND, prompt(b), 6) for b in (4, 9, 15, 30)]
        if way == "ahead-while-verifying" and speculate == "lookup":
            drive(sched, engine, ahead=True, while_verifying=late)
            assert sum(paused_verifying) == len(late)
        else:
            drive(sched, engine, ahead=way != "in-order", arrive_at={int(a[0][2:]): [a] for a in late})
        ended = [e for e in events if isinstance(e, Ended)]
        assert Counter(e.turn for e in ended) == Counter({e.turn: 1 for e in events if isinstance(e, Queued)})  # one end each
        assert len(ended) == len(turns) + len(late)
        assert sched.pool.num_free == sched.pool.num_blocks and sched.swapped_blocks == 0 and not sched.in_flight.plans
        for t in turns:
            assert t.output == reference_output(t.prompt, t.max_tokens, VOCAB, eos_every=40, ignore_eos=t.ignore_eos, window=WINDOW)
        assert sum(t.preemptions for t in turns) >= 2
        outputs.append({e.agent: e.tokens for e in ended})
        drafted.append((sum(e.drafted_tokens for e in ended), sum(e.accepted_tokens for e in ended), ended))
    assert outputs[0] == outputs[1]
    assert drafted[0][0] == 0 and drafted[1][1] > 0 and drafted[1][0] > drafted[1][1]  # some kept, some not
    spec = drafted[1][2]
    assert sum(e.sampling_steps for e in spec) < sum(e.tokens for e in spec)  # more than a token a step


def test_an_edit_that_renames_a_variable_is_verified_in_long_drafts():
    """A turn that returns its prompt's function with one variable renamed
    (its three uses): on a CPU law, where each verified row costs a token's
    compute, lookup follows the copy past each renamed use and the long runs
    pay long drafts, so the answer takes a few steps for its 100 tokens."""
    count, kept = 7, 8
    body = [(13 * i) % 89 + 10 for i in range(96)]
    body[20], body[55], body[80] = count, count, count
    answer = [kept if t == count else t for t in body] + [EOS]
    prompt = [3, 4, 5, *body, 6]
    truth = prompt + answer
    sched = Scheduler(
        SchedulerConfig(slots=1, step_tokens=512, speculate="lookup"),
        BlockPool(64, 16),
        eos_token_ids=[EOS],
        cost=StepCost(fixed_s=30.5e-3, token_s=10e-3, learns=False),
    )
    turn = sched.submit("fg", FOREGROUND, prompt, 200, 0.0)
    while sched.turns:
        plan = sched.schedule(0.0)
        answers = []
        for work in plan.works:  # (the engine's answer is the truth at every row)
            rows = [
                truth[p] if p < len(truth) else EOS
                for p in range(work.start + len(work.tokens) - work.drafts, work.start + len(work.tokens) + 1)
            ]
            answers.append((rows if work.drafts else rows[0]) if work.sample else None)
        sched.postprocess(plan, answers, 0.0)
    assert turn.output == answer
    assert turn.sampling_steps <= 16  # (one a token: 97; a copy broken at each use, priced one rate a draft: 27)


def test_verify_steps_abandoned_in_flight_change_no_turn():
    engine = KVEngine(num_blocks=40, block_size=4, vocab=VOCAB, window=WINDOW)
    sched = Scheduler(SchedulerConfig(slots=2, step_tokens=16, speculate="lookup"), BlockPool(40, 4))
    turn = sched.submit("fg", FOREGROUND, prompt(3), 50, 0.0)
    drive(sched, engine, ahead=True, abandon=6)
    assert turn.output == reference_output(prompt(3), 50, VOCAB, window=WINDOW)
    assert turn.accepted > 0 and sched.pool.num_free == sched.pool.num_blocks and not sched.in_flight.plans


@pytest.mark.parametrize("ahead", [False, True])
def test_the_foreground_speculates_beside_background_turns_that_do_not(ahead):
    engine = KVEngine(num_blocks=64, block_size=4, vocab=VOCAB, window=WINDOW)
    events: list[Event] = []
    config = SchedulerConfig(slots=4, step_tokens=32, speculate="lookup")
    sched = Scheduler(config, BlockPool(64, 4), emit=events.append)
    background = [sched.submit(f"bg{i}", BACKGROUND, prompt(i), 30, 0.0) for i in range(3)]
    foreground = sched.submit("fg", FOREGROUND, prompt(7), 40, 0.0)
    drive(sched, engine, ahead=ahead)
    for t in [*background, foreground]:
        assert t.output == reference_output(t.prompt, t.max_tokens, VOCAB, window=WINDOW)
    assert foreground.drafted > 0 and foreground.accepted > 0
    assert all(t.drafted == 0 for t in background)  # never beside the foreground, nor each other
    assert sched.pool.num_free == sched.pool.num_blocks


def test_a_constrained_or_speculation_off_turn_never_drafts():
    engine = KVEngine(num_blocks=64, block_size=4, vocab=VOCAB, window=WINDOW)
    sched = Scheduler(SchedulerConfig(slots=2, step_tokens=16), BlockPool(64, 4))
    alone = sched.submit("a", FOREGROUND, prompt(1), 30, 0.0)
    drive(sched, engine, ahead=True)
    assert alone.output == reference_output(alone.prompt, 30, VOCAB, window=WINDOW) and alone.drafted == 0


def test_the_timing_model_prices_and_answers_verify_steps():
    """The simulator's engine: a verify step costs its extra rows by the same
    law, and its constant token keeps every draft that is that token."""
    model = TimingModel.cpu()
    engine = TimingEngine(model, num_blocks=64)
    config = SchedulerConfig(slots=1, step_tokens=16, speculate="lookup")
    sched = Scheduler(config, BlockPool(64, 16), cost=engine.cost)
    sched.submit("fg", FOREGROUND, [1] * 20, 30, 0.0, ignore_eos=True)
    plans, now = [], 0.0
    while sched.turns:
        plan = sched.schedule(now)
        assert sched.repeatable(plan, 10) == 1 or not any(w.drafts for w in plan.works)
        plans.append(plan)
        now += engine.step_s(plan)
        sched.postprocess(plan, engine.step(plan.works), now)
    verify = [p for p in plans if p.works[0].drafts]
    assert verify and len(plans) < 30  # fewer steps than tokens
    work = verify[0].works[0]
    plain = Work(work.turn, work.tokens[:1], work.start, work.block_table, True)
    extra = engine.cost.predict(1 + work.drafts, 0) - engine.cost.predict(1, 0)
    step_s = engine.first_step_s(verify[0])
    assert step_s > engine.cost.predict_works([plain]) and extra > 0
    assert sched.pool.num_free == sched.pool.num_blocks


def test_a_verify_work_is_checked_at_the_engine_boundary(engine):
    from runtime.errors import EngineError

    table = list(range(4))
    with pytest.raises(EngineError, match="drafts"):
        engine.step([Work(0, [5, 6], 0, table, True, drafts=2)])
    with pytest.raises(EngineError, match="drafts"):
        engine.step([Work(0, [5, 6, 7], 0, table, False, drafts=1)])
    assert np.asarray(engine.step([Work(0, [5, 6, 7], 0, table, True, drafts=2)])[0]).shape == (3,)


# ------------------------------------------------------ the real engine


def chi_square_bound(df: int, z: float = 3.09) -> float:
    """The chi-square statistic a true hypothesis exceeds with probability about
    0.001 (z: that tail's normal quantile), by Wilson and Hilferty."""
    return df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3


def decode_alone(engine, turn: int, prompt: list[int], table: list[int], sampling, n: int) -> list[int]:
    """n tokens the plain way: the prompt, then one decode a step."""
    out = [engine.step([Work(turn, prompt, 0, table, True, sampling)])[0]]
    while len(out) < n:
        out.append(engine.step([Work(turn, [out[-1]], len(prompt) + len(out) - 1, table, True, sampling)])[0])
    return out


def decode_verifying(engine, turn: int, prompt: list[int], table: list[int], sampling, n: int, guess: list[int]) -> tuple[list[int], int]:
    """n tokens by verify steps of up to 3 drafts taken from `guess` (the tokens
    at the positions to come); and the steps it took."""
    from runtime.scheduling.drafts import accept

    out, steps = [engine.step([Work(turn, prompt, 0, table, True, sampling)])[0]], 1
    while len(out) < n:
        drafts = guess[len(out) : min(len(out) + 3, n - 1)]
        start = len(prompt) + len(out) - 1
        got = engine.step([Work(turn, [out[-1], *drafts], start, table, True, sampling, drafts=len(drafts))])[0]
        out += accept(drafts, got) if drafts else [got]
        steps += 1
    return out[:n], steps


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_sampled_turns_verifying_drafts_draw_exactly_what_they_draw_alone(engine, top_p):
    """The tiny model, both kernel families, on the device's draw (top_p 1) and
    the host's nucleus (top_p 0.9): drafts half right, half wrong."""
    from runtime.scheduling.work import Sampling

    rng = np.random.default_rng(3)
    prompt_ids = rng.integers(3, engine.config.vocab_size, 9).tolist()
    table = list(range(4))
    fewer = 0
    for seed in range(12):
        sampling = Sampling(temperature=0.8, top_p=top_p, seed=seed)
        want = decode_alone(engine, 0, prompt_ids, table, sampling, 10)
        guess = [t if (i + seed) % 3 else (t + 1) % engine.config.vocab_size for i, t in enumerate(want)]
        got, steps = decode_verifying(engine, 0, prompt_ids, table, sampling, 10, guess)
        assert got == want
        fewer += steps < 10
    assert fewer  # drafts were kept


def test_the_first_token_of_a_verify_step_follows_the_model_distribution(engine):
    """Over a fixed set of seeds, the token a verify step keeps at its first row
    (its draft, or the token drawn in its place) is distributed as softmax(logits
    / T) there: a chi-square test against the engine's own logits. (Identity
    with the plain draw, above, implies it; this checks the draw itself.)"""
    from gpu.sampling import probabilities
    from runtime.scheduling.drafts import accept
    from runtime.scheduling.work import Sampling

    rng = np.random.default_rng(5)
    prompt_ids = rng.integers(3, engine.config.vocab_size, 9).tolist()
    table = list(range(4))
    x0 = prompt_ids.pop()
    logits = engine.step_logits([Work(0, [*prompt_ids, x0], 0, table, True)])[0]
    p = probabilities(logits, 1.5)
    d1, d2 = int(np.argmax(p)), int(np.argsort(p)[-2])
    seeds = 400
    counts: Counter[int] = Counter()
    for seed in range(seeds):
        got = engine.step([Work(0, [x0, d1, d2], len(prompt_ids), table, True, Sampling(1.5, 1.0, seed), drafts=2)])[0]
        counts[accept([d1, d2], got)[0]] += 1
    expected = seeds * p
    bins = [t for t in range(p.size) if expected[t] >= 5]
    observed = [counts[t] for t in bins] + [seeds - sum(counts[t] for t in bins)]
    wanted = [expected[t] for t in bins] + [seeds - expected[bins].sum()]
    assert len(bins) >= 3 and wanted[-1] >= 5, "the draw is spread over enough tokens to test"
    chi2 = sum((o - e) ** 2 / e for o, e in zip(observed, wanted, strict=True))
    assert chi2 < chi_square_bound(len(observed) - 1)
    assert 0 < counts[d1] < seeds  # its draft kept sometimes, and replaced sometimes


# ------------------------------------------------------------ the owner


class Reader(Agent):
    """One turn, read to its end; its tokens and its end event kept."""

    def __init__(self, name: str, priority: int, prompt, max_tokens: int, sampling=None) -> None:
        super().__init__(name, priority)
        self.prompt, self.max_tokens, self.sampling = prompt, max_tokens, sampling
        self.tokens: list[int] = []
        self.text = ""

    async def run(self) -> None:
        extra = {} if self.sampling is None else {"sampling": self.sampling}
        async with self.generate(self.prompt, max_tokens=self.max_tokens, **extra) as turn:
            async for _ in turn:
                pass
        self.tokens, self.text = list(turn.tokens), turn.text


async def run_owner(engine, speculate: str, readers: list[Reader], *, slots: int = 3, policy: str = "resident", late=(), draft=None):
    """Run the readers (the `late` ones once the others have had a few steps)
    on one owner (with `draft`, the draft model's engine); their ends by
    agent, and the scheduler's blocks, and the draft model's, all free."""
    ends: dict[str, Ended] = {}
    with anyio.fail_after(300):
        async with Swarm(engine, slots=slots, policy=policy, speculate=speculate, draft=draft) as s:
            sub = s.bus.subscribe(max_buffer=10**9)
            for r in readers:
                await s.spawn(r)
            if late:
                with anyio.fail_after(60):
                    while s.owner.steps_run < 4:
                        await anyio.sleep(0.001)
                for r in late:
                    await s.spawn(r)
            for r in [*readers, *late]:
                await s.join(r.name)
            sched = s.owner.scheduler
            assert sched.pool.num_free == sched.pool.num_blocks and sched.swapped_blocks == 0, "a KV block leaked"
            drafter = s.owner.drafter
            sub.close()
            async for e in sub:
                if isinstance(e, Ended):
                    assert e.agent not in ends, "one end each"
                    ends[e.agent] = e
        if drafter is not None:
            assert drafter.held_blocks == 0, "the draft model's K/V leaked"
    return ends


@pytest.mark.anyio
@pytest.mark.parametrize("policy", ["resident", "swap", "recompute"])
async def test_through_the_owner_a_speculating_turn_says_what_it_says_without(policy):
    """A background turn alone speculates, then the foreground arrives, pauses it
    (one slot) and speculates in its turn; the owner lands each such step
    before planning the next."""
    results = {}
    for speculate in ("off", "lookup"):
        engine = KVEngine(num_blocks=40, block_size=4, vocab=VOCAB, window=WINDOW)
        bg = Reader("bg", BACKGROUND, prompt(1), 60)
        fg = Reader("fg", FOREGROUND, prompt(2), 30)
        ends = await run_owner(engine, speculate, [bg], slots=1, policy=policy, late=[fg])
        assert bg.tokens == reference_output(prompt(1), 60, VOCAB, window=WINDOW)
        assert fg.tokens == reference_output(prompt(2), 30, VOCAB, window=WINDOW)
        assert ends["bg"].tokens == 60 and ends["fg"].tokens == 30
        results[speculate] = ends
    assert results["off"]["fg"].drafted_tokens == 0
    on = results["lookup"]
    assert on["fg"].accepted_tokens > 0 and on["bg"].accepted_tokens > 0
    assert on["fg"].sampling_steps < 30 and on["bg"].sampling_steps < 60


@pytest.mark.anyio
@pytest.mark.model
async def test_greedy_smollm2_through_the_owner_says_the_same_with_speculation_on(smollm2_model):
    """The real engine: the foreground asks for a function back with one change
    beside two background turns; every turn's tokens are the same with
    speculation on and off, and the foreground's drafts were kept. (A
    background turn left alone may speculate too.)"""
    engine = OpenCLEngine(smollm2_model, num_blocks=128)
    code = "def total(prices, tax):\n    s = 0\n    for p in prices:\n        s += p\n    return s * (1 + tax)\n"
    ask = f"Return this function with `s` renamed to `subtotal`, nothing else:\n```python\n{code}```"
    results = {}
    for speculate in ("off", "lookup"):
        readers = [
            Reader("bg0", BACKGROUND, [{"role": "user", "content": "Write a haiku about the sea."}], 24),
            Reader("bg1", BACKGROUND, [{"role": "user", "content": "List three prime numbers."}], 24),
        ]
        fg = Reader("fg", FOREGROUND, [{"role": "user", "content": ask}], 60)
        ends = await run_owner(engine, speculate, readers, late=[fg])
        results[speculate] = ({r.name: r.tokens for r in [*readers, fg]}, ends)
    assert results["off"][0] == results["lookup"][0]
    on = results["lookup"][1]
    assert on["fg"].drafted_tokens > 0 and on["fg"].accepted_tokens > 0


def test_the_knob_is_checked_where_it_is_given():
    from runtime.errors import ConfigError
    from runtime.scheduling.drafts import Speculate
    from swarm.cli import build_parser
    from swarm.session import parse_session

    assert Swarm(KVEngine(), speculate="lookup").config.speculate is Speculate.LOOKUP
    assert Swarm(KVEngine()).config.speculate is Speculate.OFF  # off unless asked
    with pytest.raises(ConfigError, match="unknown speculation 'ngram'"):
        Swarm(KVEngine(), speculate="ngram")
    assert parse_session('speculate = "lookup"').speculate == "lookup"
    with pytest.raises(ConfigError):
        parse_session('speculate = "always"')
    assert build_parser().parse_args(["run", "--speculate", "lookup"]).speculate == "lookup"
    assert build_parser().parse_args(["serve", "--speculate", "lookup"]).speculate == "lookup"
