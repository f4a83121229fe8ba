"""Speculative decoding with a draft model (runtime.owner.drafter,
`--speculate draft`): the drafts come from a second engine with the target's
tokens, written in the step thread before the verify step; the turns say
exactly what they say without speculation, through preemptions, and the draft
model's K/V is its own and freed when a turn ends or is cancelled.

The fast tests use the KV test engine as both target and draft model: its
tokens are a hash of the last few tokens read from its own cache, so a draft
model with the target's window guesses every token right exactly when its K/V
holds the turn's tokens (a catch-up or rollback that went wrong shows as a
refused draft, or as a lost position it raises on), and one with another window
guesses mostly wrong (every step rolls back)."""

from __future__ import annotations

import gc
import threading
import weakref

import anyio
import numpy as np
import pytest
from kv_engine import KVEngine, next_token, reference_output
from test_speculation import VOCAB, WINDOW, Reader, drive, noting_verifying, prompt, run_owner

from runtime.errors import ConfigError
from runtime.owner.devicework import DeviceWork
from runtime.owner.drafter import DraftModel, check_same_tokens
from runtime.owner.flight import StepInFlight
from runtime.scheduling.blocks import BlockPool
from runtime.scheduling.cost import StepCost
from runtime.scheduling.drafts import Speculate, split_speculation
from runtime.scheduling.priority import BACKGROUND, FOREGROUND
from runtime.scheduling.scheduler import Scheduler
from runtime.scheduling.turns import Plan, Policy, SchedulerConfig
from runtime.scheduling.work import TO_DRAFT, Work
from swarm import Swarm


def draft_engine(window: int = WINDOW, num_blocks: int = 40) -> KVEngine:
    """A draft model on the KV test engine whose steps the cost law counts as
    nearly free (so drafting pays whatever the target's rows cost)."""
    engine = KVEngine(num_blocks=num_blocks, block_size=4, vocab=VOCAB, window=window)
    engine.cost = StepCost(fixed_s=1e-6, learns=False)
    return engine


async def run_swarm(target, draft, speculate: str, readers, *, slots: int = 1, policy: str = "resident", late=()):
    """test_speculation's run_owner with a draft model (its K/V all free at the end too)."""
    return await run_owner(target, speculate, readers, slots=slots, policy=policy, late=late, draft=draft)


@pytest.mark.anyio
@pytest.mark.parametrize("policy", ["resident", "swap", "recompute"])
@pytest.mark.parametrize("window", [WINDOW, 3])
async def test_turns_drafted_by_a_model_say_what_they_say_without_through_preemptions(policy, window):
    """A background turn alone drafts with the draft model, then the foreground
    arrives, pauses it (one slot) and drafts in its turn, under every
    preempting policy. With the target's window the draft model is always right
    (so its K/V was caught up and rolled back right); with another it is mostly
    wrong, and the turns still say the same."""
    bg = Reader("bg", BACKGROUND, prompt(1), 60)
    fg = Reader("fg", FOREGROUND, prompt(2), 30)
    target = KVEngine(num_blocks=40, block_size=4, vocab=VOCAB, window=WINDOW)
    ends = await run_swarm(target, draft_engine(window), "draft", [bg], policy=policy, late=[fg])
    assert bg.tokens == reference_output(prompt(1), 60, VOCAB, window=WINDOW)
    assert fg.tokens == reference_output(prompt(2), 30, VOCAB, window=WINDOW)
    for end in ends.values():
        assert end.drafted_tokens > 0
        if window == WINDOW:
            assert end.accepted_tokens == end.drafted_tokens  # every draft right: its K/V held the turn's tokens
            assert end.sampling_steps < end.tokens / 2
        else:
            assert end.accepted_tokens < end.drafted_tokens


@pytest.mark.anyio
async def test_only_the_foreground_drafts_beside_background_turns():
    """Three slots: the background turns never draft while others run; the
    foreground does, and every turn's tokens are those without drafts."""
    readers = [Reader(f"bg{i}", BACKGROUND, prompt(3 + i), 40) for i in range(2)]
    fg = Reader("fg", FOREGROUND, prompt(7), 40)
    target = KVEngine(num_blocks=60, block_size=4, vocab=VOCAB, window=WINDOW)
    ends = await run_swarm(target, draft_engine(), "draft", readers, slots=3, late=[fg])
    for r, i in ((readers[0], 3), (readers[1], 4), (fg, 7)):
        assert r.tokens == reference_output(prompt(i), 40, VOCAB, window=WINDOW)
    assert ends["fg"].accepted_tokens > 0


class DraftedSteps:
    """The target engine with the draft model writing each step's drafts first,
    as the owner's step thread does (DeviceWork.run_step)."""

    def __init__(self, target: KVEngine, drafter: DraftModel) -> None:
        self.target, self.drafter = target, drafter

    drafted: dict = {}  # the last step's drafts, by turn (StepInFlight.drafted)

    def step(self, works, abandon=None):
        works, self.drafted = self.drafter.fill(works)
        return self.target.step(works)

    def __getattr__(self, name: str):  # (KV moves go to the target)
        return getattr(self.target, name)


@pytest.mark.parametrize("policy", [Policy.RESIDENT, Policy.SWAP, Policy.RECOMPUTE])
@pytest.mark.parametrize("way", ["while-verifying", "abandoned"])
def test_a_turn_paused_or_abandoned_mid_verify_keeps_its_draft_model_exact(policy, way):
    """One step ahead, as the owner runs: foreground turns arrive while a
    background turn's verify step flies and pause it before it lands, under
    every preempting policy; or verify steps are abandoned after the draft
    model drafted for them (it is told those tokens again). Every turn says
    what it says without drafts, and a draft model with the target's window is
    still right every time: its K/V follows the turn through all of it."""
    target = KVEngine(num_blocks=24, block_size=4, vocab=VOCAB, window=WINDOW)
    drafter = DraftModel(draft_engine(), target)
    config = SchedulerConfig(slots=1, policy=policy, step_tokens=16, speculate="draft", max_drafts=5)
    sched = Scheduler(config, BlockPool(24, 4), cost=target.cost, draft_cost=drafter.cost)
    paused_verifying: list[bool] = []
    sched.preempt = noting_verifying(sched, paused_verifying)
    turns = [sched.submit(f"bg{i}", BACKGROUND, prompt(i), 20 + 7 * i, 0.0, ignore_eos=True) for i in range(3)]
    if way == "while-verifying":
        late = [(f"fg{b}", FOREGROUND, prompt(b), 6) for b in (4, 9, 15)]
        drive(sched, DraftedSteps(target, drafter), ahead=True, while_verifying=late)
        assert sum(paused_verifying) >= 1  # (the others arrive while a foreground verify step flies)
    else:
        drive(sched, DraftedSteps(target, drafter), ahead=True, abandon=6, abandon_from=3)
    for t in turns:
        assert t.output == reference_output(t.prompt, t.max_tokens, VOCAB, window=WINDOW)
        assert t.drafted > 0 and t.accepted == t.drafted
    assert sched.pool.num_free == sched.pool.num_blocks and not sched.in_flight.plans


def test_a_step_whose_flag_goes_up_while_it_is_drafted_for_never_runs():
    """A turn that outranks the step arrives while the draft model drafts for
    it: the draft model stops, and the step is abandoned before it starts,
    not run on stand-in drafts that would all be refused. The step run again
    drafts exactly."""
    target = KVEngine(num_blocks=24, block_size=4, vocab=VOCAB, window=WINDOW)
    draft = draft_engine()
    flag, draft_step = threading.Event(), draft.step
    target_steps = 0

    def arriving(batch, abandon=None):  # (the arrival lands during the draft model's step)
        flag.set()
        return draft_step(batch, abandon)

    def counted(batch, abandon=None):
        nonlocal target_steps
        target_steps += 1
        return KVEngine.step(target, batch, abandon)

    history, k, table = prompt(4), 4, [0, 1, 2]
    target.step([Work(1, history[:-1], 0, table, False)])
    target.step, draft.step = counted, arriving
    device = DeviceWork(target, DraftModel(draft, target))
    verify = Work(1, [history[-1]] + [TO_DRAFT] * k, len(history) - 1, table, True, drafts=k, context=history, context_start=0)
    assert device.run_step(StepInFlight(Plan(works=[verify]), None, flag, chained=False)) == (None, {}, None)
    assert target_steps == 0
    draft.step = draft_step
    again = StepInFlight(Plan(works=[verify]), None, threading.Event(), chained=False)
    out, faults, _ = device.run_step(again)
    assert out == [reference_output(history, k + 1, VOCAB, window=WINDOW)] and not faults
    assert again.drafted[1] == out[0][:k]  # every draft right


class Quitter(Reader):
    """Reads a few tokens of its turn and leaves it (the turn is cancelled)."""

    async def run(self) -> None:
        async with self.generate(self.prompt, max_tokens=self.max_tokens) as turn:
            async for token in turn:
                self.tokens.append(token)
                if len(self.tokens) >= 12:
                    break


@pytest.mark.anyio
async def test_a_cancelled_turn_frees_its_draft_model_kv():
    """A turn that drafted is cancelled midway: once the owner is idle the draft
    model holds no block and nothing of it; a later turn drafts from scratch and
    is exact."""
    target = KVEngine(num_blocks=40, block_size=4, vocab=VOCAB, window=WINDOW)
    with anyio.fail_after(120):
        async with Swarm(target, slots=1, speculate="draft", draft=draft_engine()) as s:
            drafter = s.owner.drafter
            quitter = Quitter("quitter", FOREGROUND, prompt(1), 200)
            await s.spawn(quitter)
            await s.join(quitter.name)
            assert quitter.tokens == reference_output(prompt(1), 200, VOCAB, window=WINDOW)[: len(quitter.tokens)]
            while s.owner.scheduler.turns or drafter.held_blocks:  # (until the owner is idle: it collects then)
                await anyio.sleep(0.001)
            assert drafter.held_blocks == 0 and not drafter._turns
            after = Reader("after", FOREGROUND, prompt(2), 30)
            await s.spawn(after)
            await s.join(after.name)
            assert after.tokens == reference_output(prompt(2), 30, VOCAB, window=WINDOW)


@pytest.mark.anyio
async def test_a_draft_model_short_of_blocks_evicts_or_drafts_nothing_and_stays_exact():
    """A draft model whose pool holds less than a turn's context cannot draft
    for it: the verify steps carry stand-in drafts, refused, and the turn is
    exact."""
    fg = Reader("fg", FOREGROUND, prompt(2), 40)
    target = KVEngine(num_blocks=40, block_size=4, vocab=VOCAB, window=WINDOW)
    ends = await run_swarm(target, draft_engine(num_blocks=3), "draft", [fg])
    assert fg.tokens == reference_output(prompt(2), 40, VOCAB, window=WINDOW)
    assert ends["fg"].drafted_tokens > 0


def test_the_draft_model_catches_up_and_rolls_back_by_length():
    """Told a turn's tokens a verify step at a time, some of its drafts kept and
    the next refused, the draft model drafts exactly what it would from the
    turn's tokens fed afresh: what it wrote past the refusal is never read
    (its K/V read back through the cache decides the KV engine's tokens). Forgot,
    it holds nothing."""
    window = 3

    def fresh(history: list[int], k: int) -> list[int]:
        seq, out = list(history), []
        for _ in range(k):
            out.append(next_token(seq, VOCAB, None, window))
            seq.append(out[-1])
        return out

    model = DraftModel(KVEngine(num_blocks=40, block_size=4, vocab=VOCAB, window=window), KVEngine(vocab=VOCAB))
    history, told = prompt(4), 0
    for round_, kept in enumerate([0, 2, 4, 1, 3, 0, 0, 2]):
        k = 4
        work = Work(1, [history[-1]] + [TO_DRAFT] * k, len(history) - 1, [], True, drafts=k, context=history[told:], context_start=told)
        ran, drafted = model.fill([work])
        drafts = drafted[1]
        assert ran[0].tokens == [history[-1], *drafts] and work.tokens[1:] == [TO_DRAFT] * k  # (a copy runs)
        assert drafts == fresh(history, k), f"round {round_}"
        told = len(history)
        refused = [] if kept == k else [(drafts[kept] - 3 + 1) % (VOCAB - 3) + 3]  # (the target says otherwise)
        history = history + drafts[:kept] + refused
    assert model.held_blocks > 0
    model.forget(1)
    model.collect()
    assert model.held_blocks == 0


def test_the_draft_knob_is_checked_where_it_is_given():
    from swarm.cli import build_parser
    from swarm.session import parse_session

    assert split_speculation("draft") == (Speculate.DRAFT, None)
    assert split_speculation("draft:qwen2.5-coder-0.5b") == (Speculate.DRAFT, "qwen2.5-coder-0.5b")
    for bad in ("lookup:x", "draft:", "drafts"):
        with pytest.raises(ConfigError):
            split_speculation(bad)
    target = KVEngine(vocab=VOCAB)
    assert Swarm(target, speculate="draft", draft=KVEngine(vocab=VOCAB)).config.speculate is Speculate.DRAFT
    with pytest.raises(ConfigError, match="needs the draft model's engine"):
        Swarm(target, speculate="draft")  # (the KV test engine has no catalogue to open one from)
    with pytest.raises(ConfigError, match="needs a draft model"):
        Scheduler(SchedulerConfig(speculate="draft"), BlockPool(8, 4))  # (the simulator has none)
    assert parse_session('speculate = "draft:qwen2.5-coder-0.5b"').speculate == "draft:qwen2.5-coder-0.5b"
    with pytest.raises(ConfigError, match="line 1: speculation .draft:."):
        parse_session('speculate = "draft:"')
    assert build_parser().parse_args(["run", "--speculate", "draft"]).speculate == "draft"
    assert build_parser().parse_args(["serve", "--speculate", "draft:qwen2.5-coder-0.5b"]).speculate == "draft:qwen2.5-coder-0.5b"


def test_a_draft_model_with_other_tokens_is_refused():
    with pytest.raises(ConfigError, match="does not share .* tokenizer"):
        check_same_tokens(KVEngine(vocab=VOCAB + 1), KVEngine(vocab=VOCAB))
    with pytest.raises(ConfigError, match="does not share"):
        DraftModel(KVEngine(vocab=VOCAB, eos=True), KVEngine(vocab=VOCAB))


# ------------------------------------------------------------ real models


@pytest.mark.anyio
async def test_sampled_turns_drafted_by_a_model_draw_what_they_draw_without(tiny_model, kernels):
    """The tiny model drafting for itself on the real engine, both kernel
    families: sampled turns (a seed each) draw the same tokens with the draft
    model's greedy drafts verified as without them (drafts.py: acceptance
    keeps the target's own (seed, position) draws)."""
    from gpu.engine import OpenCLEngine
    from runtime.scheduling.work import Sampling

    target = OpenCLEngine(tiny_model, num_blocks=64, kernels=kernels)
    # (the law told, not timed: whether drafting pays must not hang on this machine's speed)
    target.cost, target.calibrated = StepCost(fixed_s=1e-3, learns=False), True
    rng = np.random.default_rng(5)
    prompts = [rng.integers(3, target.config.vocab_size, 6 + i).tolist() for i in range(3)]
    results = {}
    for speculate in ("off", "draft"):
        draft = None
        if speculate == "draft":
            draft = OpenCLEngine(tiny_model, num_blocks=32, kernels=kernels)
            draft.cost, draft.calibrated = StepCost(fixed_s=1e-6, learns=False), True
        readers = [Reader(f"r{i}", FOREGROUND, p, 24, Sampling(temperature=0.8, seed=i)) for i, p in enumerate(prompts)]
        ends = {}
        for reader in readers:  # (one at a time: each runs alone, so each may speculate)
            ends.update(await run_swarm(target, draft, speculate, [reader]))
        results[speculate] = ([r.tokens for r in readers], ends)
    assert results["off"][0] == results["draft"][0]
    assert sum(e.drafted_tokens for e in results["draft"][1].values()) > 0


@pytest.mark.anyio
@pytest.mark.model
async def test_greedy_smollm2_drafting_for_itself_says_the_same(smollm2_model):
    """The real engine: SmolLM2 drafts for SmolLM2 (a second engine, its own
    K/V) for a foreground turn beside a background one; every turn's tokens are
    those without speculation, and the foreground's drafts were kept."""
    from gpu.engine import OpenCLEngine

    target = OpenCLEngine(smollm2_model, num_blocks=128)
    # (the law told, not timed: on a CPU where a second row costs as much as the first,
    # the timed law rightly says no draft pays, and the foreground drafted nothing)
    target.cost, target.calibrated = StepCost(fixed_s=1e-3, learns=False), True
    code = "def total(prices, tax):\n    s = 0\n    for p in prices:\n        s += p\n    return s * (1 + tax)\n"
    ask = f"Return this function with `s` renamed to `subtotal`, nothing else:\n```python\n{code}```"
    results = {}
    for speculate in ("off", "draft"):
        draft = OpenCLEngine(smollm2_model, num_blocks=64) if speculate == "draft" else None
        if draft is not None:
            # (drafting for itself costs a whole step a draft: the law is told
            # drafts are cheap so that it drafts here; exactness is the point)
            draft.cost, draft.calibrated = StepCost(fixed_s=1e-6, learns=False), True
        readers = [Reader("bg", BACKGROUND, [{"role": "user", "content": "Write a haiku about the sea."}], 24)]
        fg = Reader("fg", FOREGROUND, [{"role": "user", "content": ask}], 48)
        ends = await run_swarm(target, draft, speculate, readers, slots=2, late=[fg])
        results[speculate] = ({r.name: r.tokens for r in [*readers, fg]}, ends)
    assert results["off"][0] == results["draft"][0]
    on = results["draft"][1]
    assert on["fg"].drafted_tokens > 0 and on["fg"].accepted_tokens == on["fg"].drafted_tokens


@pytest.mark.anyio
@pytest.mark.model
async def test_smollm2_cannot_draft_for_qwen(smollm2_model, anyio_backend):
    from gpu.engine import OpenCLEngine, open_engine

    if anyio_backend == "trio":
        pytest.skip("the check is the same on either backend")
    qwen = open_engine("qwen2.5-coder-0.5b", num_blocks=16)
    with pytest.raises(ConfigError, match="does not share"):
        async with Swarm(qwen, speculate="draft", draft=OpenCLEngine(smollm2_model, num_blocks=16)):
            pass


# ------------------------------------------------- opening the draft model


class GatedOpen:
    """swarm.api's open_draft, the real one, held until the test lets it go on
    (`go_on`); it notes the engine it opened, weakly (so that the test sees
    whether anything still holds it)."""

    def __init__(self, open_draft) -> None:
        self.open_draft = open_draft
        self.began, self.go_on = threading.Event(), threading.Event()
        self.opened: weakref.ref | None = None

    def __call__(self, engine, name):
        self.began.set()
        # (a guard, not a measure: only an open that blocks the event loop,
        # which sets go_on as soon as it runs, waits this long)
        if not self.go_on.wait(timeout=60):
            raise RuntimeError("the event loop never let the draft model's open go on")
        draft = self.open_draft(engine, name)
        self.opened = weakref.ref(draft)
        return draft


async def freed(ref: weakref.ref | None) -> bool:
    """Whether what `ref` names was opened and nothing holds it any more. (The
    event loop holds a worker thread's result, or its error, until it has run
    the task it wakes: a turn or two of the loop, whatever the machine's speed.)"""
    for _ in range(10):
        await anyio.lowlevel.checkpoint()
        gc.collect()
        if ref is not None and ref() is None:
            return True
    return False


@pytest.fixture
def gated_open(monkeypatch) -> GatedOpen:
    import swarm.api

    gate = GatedOpen(swarm.api.open_draft)
    monkeypatch.setattr(swarm.api, "open_draft", gate)
    return gate


def tiny_target(tiny_gguf):
    """The tiny model's engine, its cost law told (no calibration: the point is
    the draft model's open)."""
    from gpu.engine import OpenCLEngine

    target = OpenCLEngine(tiny_gguf, num_blocks=32, kernels="cpu")
    target.cost, target.calibrated = StepCost(fixed_s=1e-3, learns=False), True
    return target


@pytest.mark.anyio
async def test_the_draft_model_opens_off_the_event_loop_and_goes_with_the_swarm(tiny_gguf, gated_open):
    """`Swarm(engine, speculate="draft:MODEL")` in async code: building it opens
    nothing; entering it opens the draft model in a worker thread while the
    event loop runs other tasks (this one), and the owner, given it, runs a
    turn; leaving lets go of it (freed, though the swarm object lives on)."""
    swarm = Swarm(tiny_target(tiny_gguf), slots=1, speculate=f"draft:{tiny_gguf}")
    assert not gated_open.began.is_set()
    entered, leave = anyio.Event(), anyio.Event()

    async def run() -> None:
        async with swarm:
            entered.set()
            await leave.wait()

    with anyio.fail_after(300):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await anyio.to_thread.run_sync(gated_open.began.wait)
            await anyio.wait_all_tasks_blocked()
            assert not entered.is_set()  # the open is under way, and this task runs
            gated_open.go_on.set()
            await entered.wait()
            assert gated_open.opened is not None
            assert swarm.owner.drafter is not None and swarm.owner.drafter.engine is gated_open.opened()
            reader = Reader("fg", FOREGROUND, [1, 5, 9], 8)
            await swarm.spawn(reader)
            await swarm.join(reader.name)
            assert len(reader.tokens) == 8
            leave.set()
    assert await freed(gated_open.opened)


@pytest.mark.anyio
async def test_entering_cancelled_while_the_draft_model_opens_keeps_nothing(tiny_gguf, gated_open):
    """Cancelled while its draft model opens, the entry waits for the open to
    end (no thread left working for nobody), then drops what it opened and
    closes the event stream; the swarm never started."""
    swarm = Swarm(tiny_target(tiny_gguf), slots=1, speculate=f"draft:{tiny_gguf}")
    sub = swarm.bus.subscribe()

    async def run() -> None:
        async with swarm:
            raise AssertionError("entered though cancelled")

    with anyio.fail_after(300):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await anyio.to_thread.run_sync(gated_open.began.wait)
            tg.cancel_scope.cancel()
            gated_open.go_on.set()
    assert await freed(gated_open.opened)
    assert sub.closed and [item async for item in sub] == [] and not hasattr(swarm, "owner")


@pytest.mark.anyio
async def test_a_draft_model_refused_at_entry_leaves_nothing_behind(tiny_gguf, gated_open, tmp_path):
    """A draft model with other tokens is opened, checked and refused when the
    swarm is entered: the entry's own one-line ConfigError, the engine it
    opened freed, the event stream closed with nothing in it. A name nothing
    can be opened from is refused when the swarm is built."""
    from gpu.model.synthetic import write_tiny_gguf

    other = write_tiny_gguf(tmp_path / "other-tokens.gguf", without="z")
    gated_open.go_on.set()
    target = tiny_target(tiny_gguf)
    with pytest.raises(ConfigError, match="unknown model 'qwen2.5-coder-0.6b'"):
        Swarm(target, speculate="draft:qwen2.5-coder-0.6b")
    assert not gated_open.began.is_set()
    swarm = Swarm(target, slots=1, speculate=f"draft:{other}", events=tmp_path / "events.jsonl")
    sub = swarm.bus.subscribe()
    with anyio.fail_after(300), pytest.raises(ConfigError, match="does not share .* tokenizer"):
        async with swarm:
            raise AssertionError("entered with a draft model of other tokens")
    assert await freed(gated_open.opened)
    assert sub.closed and [item async for item in sub] == [] and (tmp_path / "events.jsonl").read_text() == ""


@pytest.mark.anyio
async def test_a_cluster_owner_whose_draft_model_is_refused_says_why(tiny_gguf, tmp_path):
    """A cluster's owner (swarm.cluster.host, here without Ray) opens its draft
    model when its swarm is entered: refused there, it tells whoever waits on
    it why rather than leaving them waiting."""
    from gpu.model.synthetic import write_tiny_gguf
    from swarm.cluster.host import OwnerHost, OwnerSpec

    other = write_tiny_gguf(tmp_path / "other-tokens.gguf", without="z")
    host = OwnerHost(OwnerSpec(name="gpu0", model=str(tiny_gguf), kernels="cpu", num_blocks=32, speculate=f"draft:{other}"))
    failures: list[Exception] = []

    async def serve() -> None:
        try:
            await host.serve()
        except Exception as exc:
            failures.append(exc)

    with anyio.fail_after(300):
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve)
            with pytest.raises(RuntimeError, match="owner gpu0 could not start: ConfigError: draft model .* does not share"):
                await host.info()
    assert failures
