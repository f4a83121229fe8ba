"""Constrained decoding (issue 24): token masks on the device, a turn's place in
its constraint kept across pauses, swaps, recomputes, abandoned steps and moves,
and the ends a constraint brings (done, dead end, a bad schema).

The tiny model's weights are noise: whatever it emits under a constraint is
valid only because the masks make it so."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import anyio
import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llguidance.numpy import apply_token_bitmask_inplace
from pausing import Pausable

from gpu.engine import OpenCLEngine
from gpu.masks import TurnMasks
from gpu.model.synthetic import write_tiny_gguf
from runtime.errors import TurnFailed, UsageError
from runtime.events.kinds import Ended, Failed, Finished, Preempted, Queued, Recomputed, SwappedOut
from runtime.scheduling.constraints import Choices, Constraint, Grammar, JsonSchema, Regex, TurnConstraint
from runtime.scheduling.work import GREEDY, Sampling, Work
from swarm import BACKGROUND, FOREGROUND, Swarm

POINT = json.dumps({
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "tags": {"type": "array", "items": {"enum": ["a", "bb", "ccc"]}, "maxItems": 3},
        "at": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 99}, "ok": {"type": "boolean"}},
               "required": ["x", "ok"], "additionalProperties": False},
    },
    "required": ["name", "tags", "at"],
    "additionalProperties": False,
})  # fmt: skip


@pytest.fixture(scope="module", params=["cpu", "gpu"])
def family(request, tiny_model) -> OpenCLEngine:
    return OpenCLEngine(tiny_model, num_blocks=256, kernels=request.param)


@pytest.fixture(scope="module")
def engine(tiny_model) -> OpenCLEngine:
    return OpenCLEngine(tiny_model, num_blocks=256)


def blocks_of(turn: int) -> list[int]:
    return [turn * 8 + j for j in range(8)]


class Decoding:
    """One turn driven straight through `engine.step`, as the scheduler would:
    its prompt in one step, then a decode a step."""

    def __init__(self, turn: int, prompt: list[int], constraint: Constraint | None, sampling: Sampling = GREEDY, *, prior: int = 0) -> None:
        self.turn, self.prompt, self.sampling, self.out = turn, list(prompt), sampling, []
        seen = lambda a, b: (self.prompt + self.out)[a:b]  # noqa: E731
        self.constraint = TurnConstraint(constraint, len(self.prompt) - prior, seen) if constraint is not None else None

    def work(self) -> Work:
        tokens, start = (self.prompt, 0) if not self.out else ([self.out[-1]], len(self.prompt) + len(self.out) - 1)
        return Work(self.turn, tokens, start, blocks_of(self.turn), True, self.sampling, self.constraint)


def decode(engine: OpenCLEngine, turns: list[Decoding], steps: int, abandon_at: int | None = None) -> list[list[int]]:
    """`steps` steps of `turns` (each first abandoned at check point `abandon_at`); their outputs."""
    eos = engine.eos_token_ids
    for _ in range(steps):
        live = [d for d in turns if not (d.out and d.out[-1] in eos)]
        if not live:
            break
        batch = [d.work() for d in live]
        if abandon_at is not None:
            assert engine.step(batch, SetAt(abandon_at)) is None
        for d, token in zip(live, engine.step(batch), strict=False):
            d.out.append(token)
    for d in turns:
        engine.forget(d.turn)
    return [d.out for d in turns]


class SetAt(threading.Event):
    """A flag that reads as set from its `n`-th look on (tests/test_abandon.py)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n, self.looks = n, 0

    def is_set(self) -> bool:
        self.looks += 1
        return self.looks >= self.n


def text_of(engine: OpenCLEngine, out: list[int]) -> str:
    return engine.tokenizer.decode([t for t in out if t not in engine.eos_token_ids])


# ------------------------------------------------------------- the device


def test_masks_apply_on_the_device_as_numpy_does(family: OpenCLEngine) -> None:
    import pyopencl as cl

    rng = np.random.default_rng(1)
    e, q, b = family, family.device.queue, family.buffers
    vocab = e.config.vocab_size
    words = (vocab + 31) // 32
    logits = rng.normal(size=(6, vocab)).astype(np.float32)
    masks = rng.integers(-(2**31), 2**31, size=(3, words), dtype=np.int64).astype(np.int32)
    masks[0, ::3] = -1  # whole words allowed (skipped), and whole words refused
    masks[1, 1::4] = 0
    rows = np.array([4, 0, 2], np.int32)  # some rows constrained, in any order
    cl.enqueue_copy(q, b.logits, logits)
    e.inputs.write(q, mask_rows=rows)
    cl.enqueue_copy(q, b.masks, masks)
    e.launches.mask.enqueue(q, len(rows))
    got = np.empty_like(logits)
    cl.enqueue_copy(q, got, b.logits)
    q.finish()
    want = logits.copy()
    for k, r in enumerate(rows):
        apply_token_bitmask_inplace(want[r], masks[k])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=1.0, seed=5), Sampling(temperature=0.8, top_p=0.9, seed=2)])
def test_a_constrained_row_samples_only_what_its_mask_allows(family: OpenCLEngine, sampling: Sampling) -> None:
    e = family
    constraint = Regex("[a-f]{3,}")
    free = Decoding(1, e.tokenizer.encode("abc xyz"), None, sampling)
    held = Decoding(2, e.tokenizer.encode("abc xyz"), constraint, sampling)
    logits = e.step_logits([held.work()])[0]
    masks = TurnMasks(e.constraints)
    mask = np.empty((1, masks.words), np.int32)
    assert masks.fill([held.work()], mask) == {}
    apply_token_bitmask_inplace(logits, mask[0])
    free_token, held_token = e.step([free.work(), held.work()])
    if sampling.greedy:
        assert held_token == int(np.argmax(logits))
    assert np.isfinite(logits[held_token])  # allowed
    assert e.tokenizer.decode([held_token]) and set(e.tokenizer.decode([held_token])) <= set("abcdef")
    e.forget(2)


def test_a_batch_without_a_constrained_row_does_no_mask_work(engine: OpenCLEngine) -> None:
    before = engine.mask_times.steps
    decode(engine, [Decoding(1, [5, 6, 7], None)], 3)
    assert engine.mask_times.steps == before


# ----------------------------------------------------- validity, any schema


@st.composite
def schemas(draw, depth: int = 0) -> dict:
    """Small schemas whose every instance is short: strings, numbers and arrays bounded."""
    kinds = ["string", "pattern", "enum", "integer", "boolean", "array"] + (["object"] * 2 if depth < 2 else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "string":
        return {"type": "string", "maxLength": draw(st.integers(0, 6))}
    if kind == "pattern":
        return {"type": "string", "pattern": draw(st.sampled_from(["^[a-z]{1,4}$", "^[0-9]{2}-[A-Z]$", "^(yes|no)$"]))}
    if kind == "enum":
        return {"enum": draw(st.lists(st.sampled_from(["red", "green", "x y", "é", 3, None, True]), min_size=1, max_size=4, unique=True))}
    if kind == "integer":
        low = draw(st.integers(-50, 50))
        return {"type": "integer", "minimum": low, "maximum": low + draw(st.integers(0, 200))}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "array":
        return {"type": "array", "items": draw(schemas(depth + 1)), "maxItems": draw(st.integers(0, 3))}
    names = draw(st.lists(st.sampled_from(["a", "id", "name", "kind", "n_1", "ok"]), min_size=1, max_size=3, unique=True))
    properties = {n: draw(schemas(depth + 1)) for n in names}
    return {"type": "object", "properties": properties, "required": names, "additionalProperties": False}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(schema=schemas(), hot=st.booleans(), seed=st.integers(0, 2**16))
def test_random_schemas_give_valid_json_even_from_noise(engine: OpenCLEngine, schema: dict, hot: bool, seed: int) -> None:
    sampling = Sampling(temperature=1.0, seed=seed) if hot else Sampling()
    d = Decoding(9, engine.tokenizer.encode("{"), JsonSchema(json.dumps(schema)), sampling)
    (out,) = decode(engine, [d], 200)
    assert out[-1] in engine.eos_token_ids, f"unfinished: {text_of(engine, out)!r}"
    jsonschema.validate(json.loads(text_of(engine, out)), schema)
    assert len(engine.masks) == 0  # forgotten: no matcher left behind


@pytest.mark.parametrize("constraint, check", [
    (Regex(r"[a-c]{2}-\d{1,3}"), lambda s: __import__("re").fullmatch(r"[a-c]{2}-\d{1,3}", s)),
    (Grammar('start: "(" item (" " item)* ")"\nitem: /[xyz]/ | start', "lark"), lambda s: s.startswith("(") and s.endswith(")")),
    (Grammar('root ::= "on" | "off"', "gbnf"), lambda s: s in ("on", "off")),
    (Choices(("alpha", "beta", "gamma")), lambda s: s in ("alpha", "beta", "gamma")),
])  # fmt: skip
def test_each_kind_of_constraint_ends_its_turn_with_what_it_allows(engine: OpenCLEngine, constraint, check) -> None:
    for sampling in (Sampling(), Sampling(temperature=1.0, seed=3)):
        (out,) = decode(engine, [Decoding(4, [70, 71], constraint, sampling)], 120)
        assert out[-1] in engine.eos_token_ids and check(text_of(engine, out)), text_of(engine, out)


# ------------------------------------------- the turn's place, whatever happens


@pytest.mark.parametrize("stop_at", [1, 3])
def test_an_abandoned_step_does_not_move_a_turn_in_its_constraint(engine: OpenCLEngine, stop_at: int) -> None:
    def run(first: int, abandon_at: int | None) -> list[list[int]]:
        turns = [
            Decoding(first + i, [10 + i, 20, 30 + i], JsonSchema(POINT), s)
            for i, s in enumerate([Sampling(), Sampling(temperature=1.0, seed=4)])
        ]
        return decode(engine, turns, 25, abandon_at)

    assert run(20, stop_at) == run(10, None)


def test_a_turn_moved_to_a_fresh_engine_resumes_its_constraint_from_its_tokens(tiny_model, engine: OpenCLEngine) -> None:
    (whole,) = decode(engine, [Decoding(1, [40, 41], JsonSchema(POINT))], 80)
    k = 7  # mid-object
    fresh = OpenCLEngine(tiny_model, num_blocks=256)
    (rest,) = decode(fresh, [Decoding(1, [40, 41] + whole[:k], JsonSchema(POINT), prior=k)], 80)
    assert whole[-1] in engine.eos_token_ids and rest == whole[k:]


def test_a_turn_whose_place_was_lost_finds_it_again_from_its_tokens(engine: OpenCLEngine) -> None:
    (whole,) = decode(engine, [Decoding(1, [40, 41], JsonSchema(POINT))], 80)
    d = Decoding(2, [40, 41], JsonSchema(POINT))
    decode_kept = lambda steps: [engine.step([d.work()])[0] for _ in range(steps)]  # noqa: E731
    for _ in range(6):
        d.out += decode_kept(1)
    engine.masks.forget(2)  # as a Forget move, or a failed one, has the engine do
    before = engine.masks.replayed
    (out,) = decode(engine, [d], 80)
    assert out == whole and engine.masks.replayed - before >= 5  # (the 6th comes with the decode)


@pytest.fixture(scope="module")
def unpaused(tiny_model) -> tuple[list[int], list[int]]:
    return anyio.run(paused_run, OpenCLEngine(tiny_model, num_blocks=256), "resident", False)


async def paused_run(engine: OpenCLEngine, policy: str, pause: bool) -> tuple[list[int], list[int], list]:
    """A background turn held to POINT; with `pause`, a foreground one (held to a
    regex) takes the only slot once the background one is a few tokens into its
    object. Both outputs, and the events."""
    async with Swarm(engine, slots=1 if pause else 2, policy=policy) as s:
        sub = s.bus.subscribe(max_buffer=10**6)
        bg = await s.spawn(Pausable("bg", BACKGROUND))
        fg = await s.spawn(Pausable("fg", FOREGROUND))
        outs: dict[str, list[int]] = {}
        async with anyio.create_task_group() as tg:
            async with bg.generate([40, 41], max_tokens=60, constraint=JsonSchema(POINT)) as turn:
                async for _ in turn:
                    if len(turn.tokens) == 4 and "fg" not in outs:
                        outs["fg"] = []

                        async def foreground() -> None:
                            async with fg.generate([50], max_tokens=20, constraint=Regex("[0-9]{3}-[a-z]{3}")) as other:
                                async for _ in other:
                                    pass
                            outs["fg"] = other.tokens

                        tg.start_soon(foreground)
                outs["bg"] = turn.tokens
        events = sub.take_ready()
    assert len(engine.masks) == 0  # every matcher dropped with its turn
    return outs["bg"], outs["fg"], events


@pytest.mark.parametrize("policy", ["resident", "swap", "recompute"])
@pytest.mark.asyncio
async def test_a_constrained_turn_paused_mid_object_gives_what_it_gives_unpaused(tiny_model, unpaused, policy: str) -> None:
    engine = OpenCLEngine(tiny_model, num_blocks=256)
    with anyio.fail_after(120):
        bg, fg, events = await paused_run(engine, policy, True)
    assert bg == unpaused[0] and fg == unpaused[1]
    assert any(isinstance(e, Preempted) and e.agent == "bg" for e in events)
    if policy == "swap":
        assert any(isinstance(e, SwappedOut) for e in events)
    if policy == "recompute":
        assert any(isinstance(e, Recomputed) for e in events)
    json.loads(text_of(engine, bg))


# ---------------------------------------------------------------- the ends


@pytest.mark.asyncio
async def test_a_bad_schema_is_a_usage_error_before_the_turn_is_queued(engine: OpenCLEngine) -> None:
    with anyio.fail_after(60):
        async with Swarm(engine, slots=2) as s:
            sub = s.bus.subscribe(max_buffer=10**6)
            agent = await s.spawn(Pausable("a"))
            for bad, says in [(JsonSchema('{"type": "objekt"}'), "objekt"), (JsonSchema('{"if": {}, "then": {}}'), "if"),
                              (JsonSchema("{nope"), "not valid JSON"), (Regex("[a-"), "regex"), (Grammar("start: b"), "b")]:  # fmt: skip
                with pytest.raises(UsageError, match=says):
                    async with agent.generate("hi", constraint=bad):
                        pass
            with pytest.raises(UsageError, match="constraint must be"):
                agent.generate("hi", constraint='{"type": "object"}')
            assert not s.owner.scheduler.turns
            assert not [e for e in sub.take_ready() if isinstance(e, Queued)]


@pytest.mark.asyncio
async def test_a_dead_end_fails_its_turn_and_no_other(tmp_path: Path) -> None:
    # No token of this model holds a "z": after "a", the regex az allows nothing.
    engine = OpenCLEngine(write_tiny_gguf(tmp_path / "no-z.gguf", without="z"), num_blocks=256)
    with anyio.fail_after(120):
        async with Swarm(engine, slots=2) as s:
            a, b = await s.spawn(Pausable("a")), await s.spawn(Pausable("b"))

            answers = []

            async def other() -> None:
                answers.append(await b.complete("hi", max_tokens=30, constraint=Choices(("yes", "no"))))

            async with anyio.create_task_group() as tg:
                tg.start_soon(other)
                with pytest.raises(TurnFailed, match="dead end: the regex 'az' allows no token after 1 tokens of output") as failed:
                    await a.complete("hi", max_tokens=30, constraint=Regex("az"))
            assert failed.value.reason.startswith("dead end") and answers[0] in ("yes", "no")
        assert len(engine.masks) == 0


@pytest.mark.asyncio
async def test_a_finished_grammar_ends_its_turn_as_a_stop(engine: OpenCLEngine) -> None:
    with anyio.fail_after(60):
        async with Swarm(engine, slots=2) as s:
            agent = await s.spawn(Pausable("a"))
            async with agent.generate("hi", max_tokens=50, constraint=Choices(("yes", "no"))) as turn:
                async for _ in turn:
                    pass
    assert isinstance(turn.ended, Finished) and turn.ended.reason == "eos" and turn.text in ("yes", "no")


@pytest.mark.asyncio
async def test_a_bad_constraint_sent_past_the_agents_check_fails_only_its_turn(engine: OpenCLEngine) -> None:
    from runtime.owner.messages import TurnRequest

    with anyio.fail_after(60):
        async with Swarm(engine, slots=2) as s:
            agent = await s.spawn(Pausable("a"))
            answers = []

            async def good() -> None:
                answers.append(await agent.complete("hi", max_tokens=30, constraint=Choices(("yes", "no"))))

            async with anyio.create_task_group() as tg:
                tg.start_soon(good)
                bad = TurnRequest(agent="a", priority=0, prompt=[5, 6], max_tokens=5, constraint=Regex("[a-"))
                channel = await s.client.submit(s.client.new_turn_id(), bad)
                ends = [u async for u in channel.receive if isinstance(u, Ended)]
    assert isinstance(ends[-1], Failed) and "the regex '[a-'" in ends[-1].reason and "engine error" not in ends[-1].reason
    assert answers[0] in ("yes", "no")


# ------------------------------------------------- hostile and careless input


def nested(levels: int) -> str:
    return '{"type": "array", "items": ' * levels + '{"type": "string"}' + "}" * levels


@pytest.mark.asyncio
async def test_hostile_constraints_are_one_usage_error_each_and_the_swarm_goes_on(engine: OpenCLEngine) -> None:
    cycle = json.dumps({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}})
    holds_itself: dict = {"type": "object"}
    holds_itself["properties"] = {"me": holds_itself}
    deep: dict = {"type": "string"}
    for _ in range(5000):
        deep = {"type": "array", "items": deep}
    with anyio.fail_after(120):
        async with Swarm(engine, slots=2) as s:
            sub = s.bus.subscribe(max_buffer=10**6)
            agent = await s.spawn(Pausable("a"))
            for kwargs, says in [
                ({"constraint": JsonSchema(nested(5000))}, "nests too deeply"),
                ({"schema": deep}, "nests too deeply"),
                ({"schema": holds_itself}, "has no JSON Schema"),
                ({"constraint": JsonSchema(cycle)}, "matches nothing"),
                ({"regex": "[^\\x00-\\U0010ffff]"}, "matches nothing"),
                ({"choices": [f"option {i}" for i in range(100_000)]}, "characters long"),
                ({"grammar": "start: " + " | ".join(f'"w{i}"' for i in range(50_000))}, "characters long"),
                ({"choices": ["yes", ""]}, "non-empty"),
            ]:
                with pytest.raises(UsageError, match=says):
                    async with agent.generate("hi", **kwargs):
                        pass
            assert await agent.complete("hi", max_tokens=30, choices=["yes", "no"]) in ("yes", "no")
            assert [type(e).__name__ for e in sub.take_ready() if isinstance(e, (Queued, Ended))] == ["Queued", "Finished"]


@pytest.mark.asyncio
async def test_a_checked_constraint_is_copied_for_each_turn_never_compiled_again(tiny_model) -> None:
    # Compiling a large constraint takes seconds; in the step thread, every
    # stream would wait that long. Its turns get copies of what the check compiled.
    engine = OpenCLEngine(tiny_model, num_blocks=256)
    wide = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(300)}, "additionalProperties": False}
    with anyio.fail_after(120):
        async with Swarm(engine, slots=2) as s:
            agent = await s.spawn(Pausable("a"))
            for _ in range(3):
                async with agent.generate("hi", max_tokens=4, schema=wide) as turn:
                    async for _ in turn:
                        pass
                assert turn.text.startswith("{")
    assert engine.constraints.built == 1 and len(engine.masks) == 0


def test_the_compiled_constraints_kept_are_bounded_least_recently_used_first(tiny_model) -> None:
    from gpu.grammar import CACHED

    compiler = OpenCLEngine(tiny_model, num_blocks=16).constraints
    compiler.check(Regex("kept"))
    for i in range(CACHED + 20):
        compiler.check(Regex(f"r{i}"))
        compiler.check(Regex("kept"))  # used again: never the one dropped
    assert len(compiler) == CACHED
    built = compiler.built
    compiler.check(Regex("kept"))
    compiler.check(Regex("r0"))  # dropped long since: compiled again
    assert compiler.built == built + 1


def test_a_turn_forgotten_while_a_step_holds_its_work_leaves_no_matcher(engine: OpenCLEngine) -> None:
    # The owner forgets a turn that ended while the step after it is in flight
    # (planned before the end was known), in any order with that step's fills:
    # before its first constrained step made it a matcher, or between the fills
    # of a step that masks its rows a few at a time.
    masks = engine.masks
    a = Decoding(25, [40, 41], JsonSchema(POINT))
    b = Decoding(26, [42, 43], JsonSchema(POINT))
    c = Decoding(27, [44, 45], JsonSchema(POINT))
    masks.forget(b.turn)  # ended before its first step, which was already planned
    for d, token in zip([a, b, c], engine.step([a.work(), b.work(), c.work()]), strict=False):
        d.out.append(token)
    assert len(masks) == 2  # a's and c's
    masks.forget(c.turn)
    step = masks.begin_step()
    out = np.empty((2, masks.words), np.int32)
    masks.fill([a.work()], out[:1])  # the step's first share, then the forget's step ends...
    masks.fill([c.work()], out[1:])  # ...and its second brings c's place back, for this step
    masks.end_step(step)
    engine.step([a.work()])
    assert len(masks) == 1  # a's alone
    engine.forget(a.turn)
    engine.step([Decoding(28, [46], None).work()])
    assert len(masks) == 0
    engine.forget(28)


@pytest.mark.asyncio
async def test_a_churn_of_constrained_turns_ending_every_way_leaves_no_matcher(tiny_model) -> None:
    """Constrained turns that finish, are left mid-stream by their agent, are
    cancelled with the task reading them (a client that hangs up), are paused
    and their steps abandoned for a foreground turn, and are cut off by the
    swarm stopping: each ends in exactly one terminal event, and no matcher is
    left behind."""
    from runtime.errors import TurnCancelled

    engine = OpenCLEngine(tiny_model, num_blocks=256)
    forever = Regex("[a-z ]+")  # never complete: only a cut ends it
    kinds = [JsonSchema(POINT), Choices(("yes", "no")), forever]
    ended: list[str] = []
    with anyio.fail_after(300):
        async with anyio.create_task_group() as outside:
            async with Swarm(engine, slots=2) as s:
                sub = s.bus.subscribe(max_buffer=10**6)
                bg = [await s.spawn(Pausable(f"bg{i}")) for i in range(3)]
                fg = await s.spawn(Pausable("fg", FOREGROUND))

                async def one(agent: Pausable, i: int) -> None:
                    constraint = kinds[i % len(kinds)]
                    how = i % 4
                    with anyio.CancelScope() as scope:
                        async with agent.generate(
                            [40 + i % 7, 41], max_tokens=12 if constraint is forever else 60, constraint=constraint
                        ) as turn:
                            async for _ in turn:
                                if how == 1 and len(turn.tokens) >= 2:
                                    break  # left by its agent
                                if how == 2 and len(turn.tokens) >= 3:
                                    scope.cancel()  # the task reading it is cancelled
                    ended.append(f"{how}")

                async def foreground(i: int) -> None:
                    await fg.complete([60 + i], max_tokens=3, constraint=Regex("[0-9]{2,}"))

                async with anyio.create_task_group() as tg:
                    for i in range(24):
                        tg.start_soon(one, bg[i % 3], i)
                        if i % 6 == 5:
                            tg.start_soon(foreground, i)
                # Two turns that never end on their own, running when the swarm stops.
                started = [anyio.Event(), anyio.Event()]

                async def cut(k: int) -> None:
                    with pytest.raises((TurnCancelled, TurnFailed)):
                        async with bg[k].generate([50, 51], max_tokens=4000, constraint=forever) as turn:
                            async for _ in turn:
                                started[k].set()

                for k in range(2):
                    outside.start_soon(cut, k)
                for event in started:
                    await event.wait()
                events = sub
            # (the swarm has stopped)
    log = events.take_ready()
    queued = [e.turn for e in log if isinstance(e, Queued)]
    ends = [e.turn for e in log if isinstance(e, Ended)]
    assert len(queued) == 24 + 4 + 2 and sorted(ends) == sorted(queued) and len(set(ends)) == len(ends)
    assert any(isinstance(e, Preempted) for e in log)
    assert len(engine.masks) == 0


class HeldCompiler:
    """Builds the engine's own ConstraintCompiler, whose compile of a constraint
    in `held` waits at `gate` once it has said so (`entered`, with the thread)."""

    def __new__(cls, engine: OpenCLEngine, held: set):
        from gpu.grammar import ConstraintCompiler

        class Held(ConstraintCompiler):
            def _compile(self, constraint):
                if constraint in held:
                    self.entered.append((constraint, threading.get_ident()))
                    self.arrived.set()
                    self.gate.wait(120)
                return super()._compile(constraint)

        compiler = Held(engine.tokenizer, engine.config.vocab_size)
        compiler.entered, compiler.arrived, compiler.gate = [], threading.Event(), threading.Event()
        return compiler


@pytest.mark.asyncio
async def test_slow_compiles_run_one_at_a_time_off_the_loop_and_stall_no_stream(tiny_model) -> None:
    from runtime.scheduling.constraints import _compile_limiter

    engine = OpenCLEngine(tiny_model, num_blocks=256)
    slow = [Regex("[0-9]{4}"), Regex("[a-f]{4}")]
    held = engine.__dict__["constraints"] = HeldCompiler(engine, set(slow))
    loop_thread = threading.get_ident()
    with anyio.fail_after(120):
        async with Swarm(engine, slots=3) as s:
            reader, other, late = [await s.spawn(Pausable(n)) for n in ("reader", "other", "late")]
            assert await other.complete("hi", max_tokens=10, choices=["yes", "no"]) in ("yes", "no")
            answers = []
            async with anyio.create_task_group() as tg, reader.generate([5, 6], max_tokens=2000, ignore_eos=True) as stream:
                await anext(stream)
                for agent, constraint in zip((other, late), slow, strict=False):
                    tg.start_soon(lambda a=agent, c=constraint: _append(answers, a.complete("hi", max_tokens=8, constraint=c)))
                await anyio.to_thread.run_sync(held.arrived.wait, 120)
                await anyio.wait_all_tasks_blocked()
                # One compile runs, in a worker thread; the other waits its turn, in the event loop.
                assert len(held.entered) == 1 and held.entered[0][1] != loop_thread
                assert _compile_limiter().statistics().tasks_waiting == 1
                # Meanwhile the stream flows, and a turn whose constraint is compiled waits for neither.
                seen = len(stream.tokens)
                for _ in range(20):
                    await anext(stream)
                assert len(stream.tokens) >= seen + 20
                assert await reader.complete("hi", max_tokens=10, choices=["yes", "no"]) in ("yes", "no")
                held.gate.set()
            assert sorted(len(a) for a in answers) == [4, 4]


async def _append(into: list, answer) -> None:
    into.append(await answer)
