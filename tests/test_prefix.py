"""Prefix reuse in the scheduler: what is shared, what is computed, and how sharing
meets preemption, swap and recompute. Token counts, never times."""

from __future__ import annotations

import msgspec
from hypothesis import example, given, settings
from hypothesis import strategies as st
from kv_engine import KVEngine, reference_output

from runtime.events.kinds import Admitted, Event, Preempted, Recomputed, SwappedOut
from runtime.scheduling.blocks import BlockPool
from runtime.scheduling.prefix import PrefixCache
from runtime.scheduling.priority import BACKGROUND, FOREGROUND
from runtime.scheduling.scheduler import Scheduler
from runtime.scheduling.turns import Copy, Forget, Plan, SchedulerConfig, Status, SwapOut, Turn

B = 4  # positions per block


class Rig:
    """A scheduler and a fake engine: a turn's next token is 7 (never eos). With
    `kv`, a KVEngine runs each plan instead, its moves in order as the GPU owner
    does, so a turn's tokens prove its K/V intact."""

    def __init__(self, policy="resident", slots=2, blocks=64, kv=False, **config):
        self.events: list[Event] = []
        self.sched = Scheduler(SchedulerConfig(slots=slots, policy=policy, **config), BlockPool(blocks, B), emit=self.events.append)
        self.engine = KVEngine(num_blocks=blocks, block_size=B) if kv else None
        self.now = 0.0
        self.plans = []

    def submit(self, agent, prompt, max_tokens=4, priority=BACKGROUND) -> Turn:
        return self.sched.submit(agent, priority, prompt, max_tokens, self.now)

    def step(self):
        plan = self.sched.schedule(self.now)
        self.plans.append(plan)
        if self.engine is None:
            tokens = [7 if w.sample else None for w in plan.works]
        else:
            for move in plan.moves:
                move.apply(self.engine)
            tokens = self.engine.step(plan.works)
        self.now += 0.01
        self.sched.postprocess(plan, tokens, self.now)
        return plan

    def finish(self, *turns):
        while not all(t.done for t in turns):
            self.step()

    def computed(self, turn_id) -> int:
        """Tokens the engine was given for a turn, over every step so far."""
        return sum(len(w.tokens) for p in self.plans for w in p.works if w.turn == turn_id)

    def named(self, kind):
        return [e for e in self.events if isinstance(e, kind)]


PROMPT = list(range(10, 31))  # 21 tokens: 5 full blocks and one more token


def test_a_repeated_prompt_computes_only_its_last_partial_block():
    rig = Rig()
    first = rig.submit("a", PROMPT)
    rig.finish(first)
    second = rig.submit("b", PROMPT)
    rig.step()
    assert rig.named(Admitted)[1].cached_tokens == 20
    assert all(rig.sched.pool.is_cached(b) for b in second.blocks[:5])
    rig.finish(second)
    assert rig.computed(second.id) == 1 + 3  # the 21st prompt token, then 3 decodes
    assert second.output == first.output


def test_a_prompt_of_whole_blocks_copies_the_rows_of_its_last_block_and_computes_its_last_token():
    rig = Rig()
    rig.finish(rig.submit("a", PROMPT[:20]))
    again = rig.submit("b", PROMPT[:20])
    rig.step()
    assert again.cached_tokens == 19 and rig.plans[-1].works[0].tokens == PROMPT[19:20]
    # Blocks 0-3 by reference; block 4's first three rows copied into its own block.
    assert all(rig.sched.pool.is_cached(b) for b in again.blocks[:4])
    (copy,) = rig.plans[-1].moves
    assert copy.turn == again.id and copy.target == again.blocks[4]
    assert copy.source not in again.blocks and rig.sched.pool.refs(copy.source) == 0  # the first turn's, cached


def test_a_repeated_prompt_takes_the_last_partial_block_itself_and_computes_one_token():
    rig = Rig()
    prompt = PROMPT + [40, 41]  # 23 tokens: 5 full blocks and 3 positions of a sixth
    first = rig.submit("a", prompt, max_tokens=1)
    rig.finish(first)
    again = rig.submit("b", prompt, max_tokens=2)
    plan = rig.step()
    # Nobody holds the first turn's last block and it holds only the turn's own
    # tokens: no copy, the block itself (its third row is rewritten, identically).
    assert not plan.moves and plan.works[0].start == 22 and plan.works[0].tokens == [41]
    assert rig.sched.pool.noted_rows(again.blocks[5]) == (30, 40, 41)
    rig.finish(again)
    assert again.cached_tokens == 22 and rig.computed(again.id) == 1 + 1
    assert again.ended.cached_tokens == 22 and again.output == first.output + [7]
    assert rig.sched.pool.num_free == 64


def test_a_block_another_turn_holds_is_copied_not_taken():
    rig = Rig(slots=2)
    prompt = PROMPT + [40, 41]
    first = rig.submit("a", prompt, max_tokens=8)
    rig.step()  # its prompt computed, its sixth block private and noted
    again = rig.submit("b", prompt, max_tokens=2)
    plan = rig.step()
    (copy,) = plan.moves
    assert copy.source == first.blocks[5] and copy.target == again.blocks[5] != first.blocks[5]
    assert again.cached_tokens == 22


def test_a_fork_shares_its_full_blocks_and_copies_the_rows_it_shares_of_the_next():
    rig = Rig()
    rig.finish(rig.submit("a", PROMPT))
    fork = rig.submit("b", PROMPT[:9] + [99] * 12)  # differs from position 9 (inside block 2)
    rig.step()
    assert fork.cached_tokens == 9
    assert rig.plans[-1].works[0].start == 9


def test_turns_that_arrive_together_compute_their_common_prefix_once():
    """Two agents send one system prompt at once: the second waits while the first
    computes each block they share, and takes it by reference."""
    rig = Rig(slots=2, step_tokens=8)
    system = list(range(100, 124))  # 6 blocks
    a = rig.submit("a", system + [1, 2, 3], max_tokens=2)
    b = rig.submit("b", system + [4, 5, 6, 7, 8], max_tokens=2)
    rig.finish(a, b)
    assert a.blocks == [] and rig.computed(a.id) == 27 + 1
    assert rig.computed(b.id) == 29 - 24 + 1 and b.ended.cached_tokens == 24
    assert rig.sched.pool.num_free == 64


def test_turns_running_side_by_side_share_blocks_by_reference():
    rig = Rig(slots=3)
    first = rig.submit("a", PROMPT, max_tokens=20)
    for _ in range(3):
        rig.step()
    second = rig.submit("b", PROMPT, max_tokens=20)
    rig.step()
    assert second.blocks[:5] == first.blocks[:5]
    assert all(rig.sched.pool.refs(b) == 2 for b in first.blocks[:5])
    assert second.blocks[5] != first.blocks[5]  # its own partial block
    rig.finish(first, second)
    assert second.output == first.output
    assert rig.sched.pool.num_free == 64


def test_a_multi_turn_agent_reuses_its_conversation():
    """The next turn resends the conversation so far: prompt and reply are cached."""
    rig = Rig()
    turn = rig.submit("a", PROMPT, max_tokens=12)
    rig.finish(turn)
    conversation = PROMPT + turn.output + [50, 51, 52]  # 21 + 12 + 3 = 36 tokens
    follow_up = rig.submit("a", conversation)
    rig.step()
    # Positions 0..31 were computed by the first turn (its last token never was).
    assert follow_up.cached_tokens == 32
    assert rig.plans[-1].works[0].tokens == conversation[32:]


def test_cache_off_computes_everything():
    rig = Rig(prefix_cache=False)
    rig.finish(rig.submit("a", PROMPT))
    again = rig.submit("b", PROMPT)
    rig.finish(again)
    assert again.cached_tokens == 0 and rig.computed(again.id) == 21 + 3
    assert rig.named(Admitted)[1].cached_tokens == 0


def test_the_model_is_part_of_the_key():
    turn = Turn(1, "a", 0, PROMPT, 4)
    keys = [PrefixCache(BlockPool(8, B, namespace=name)).chain(Turn(1, "a", 0, PROMPT, 4), 5) for name in ("m1", "m2")]
    assert keys[0] != keys[1] and len(set(keys[0]) | set(keys[1])) == 10
    assert PrefixCache(BlockPool(8, B, namespace="m1")).chain(turn, 5) == keys[0]


def test_a_recomputed_turn_hits_the_cache_again():
    rig = Rig(policy="recompute", slots=1, step_tokens=64)
    low = rig.submit("docs", PROMPT, max_tokens=20)
    for _ in range(4):
        rig.step()
    length = low.length
    high = rig.submit("pair", [1, 2, 3], max_tokens=2, priority=FOREGROUND)
    rig.step()
    assert low.status is Status.DROPPED and low.blocks == []
    rig.finish(high)
    rig.step()
    (event,) = rig.named(Recomputed)
    assert event.cached_tokens == length - 1 and event.tokens == length - event.cached_tokens


def test_swap_out_leaves_blocks_other_turns_hold_and_takes_them_back():
    rig = Rig(policy="swap", slots=2)
    keep = rig.submit("a", PROMPT, max_tokens=30)
    rig.step()
    low = rig.submit("b", PROMPT, max_tokens=30)
    for _ in range(3):
        rig.step()
    shared = low.blocks[:5]
    assert shared == keep.blocks[:5]
    high = rig.submit("pair", [1, 2, 3], max_tokens=3, priority=FOREGROUND)
    rig.step()
    assert low.status is Status.SWAPPED and low.swap_kept == [0, 1, 2, 3, 4]
    (out,) = [op for p in rig.plans for op in p.swap_out]
    assert out[0] == low.id and len(out[1]) == 1 and out[2] == low.swapped_len - 20  # only its own block
    assert rig.named(SwappedOut)[0].blocks == 1 and rig.sched.swapped_blocks == 1
    rig.finish(high)
    rig.step()
    assert low.status.resident and low.blocks[:5] == shared
    (into,) = [op for p in rig.plans for op in p.swap_in]
    assert into[0] == low.id and len(into[1]) == 1 and rig.sched.swapped_blocks == 0
    rig.finish(keep, low)
    assert rig.sched.pool.num_free == 64


def test_a_swapped_turn_whose_shared_blocks_were_evicted_is_recomputed():
    rig = Rig(policy="swap", slots=2, blocks=16, step_tokens=64)
    keep = rig.submit("a", PROMPT, max_tokens=30)
    rig.step()
    low = rig.submit("b", PROMPT, max_tokens=10)
    rig.step()
    rig.submit("pair", list(range(100, 130)), max_tokens=8, priority=FOREGROUND)
    rig.step()
    assert low.status is Status.SWAPPED and low.swap_kept == [0, 1, 2, 3, 4]
    rig.sched.cancel(keep.id, rig.now)  # the shared blocks are now only cached...
    other = rig.submit("pair", list(range(200, 230)), max_tokens=2, priority=FOREGROUND)
    rig.step()  # ...and the other foreground turn's 7 blocks evict 3 of them
    assert low.status is Status.SWAPPED and rig.sched.pool.num_cached < 5
    rig.finish(other)  # a slot frees: the swapped turn comes back, but its shared blocks are gone
    rig.step()
    assert Forget(low.id) in [m for p in rig.plans for m in p.moves]  # so its host copy is void: the engine drops it
    (event,) = rig.named(Recomputed)
    assert event.turn == low.id and event.tokens + event.cached_tokens == len(PROMPT) + 1
    assert rig.sched.swapped_blocks == 0
    rig.finish(low)
    assert rig.sched.pool.num_free == 16


def test_memory_pressure_evicts_the_cache_before_any_paused_turn():
    rig = Rig(policy="resident", slots=1, blocks=12)
    rig.finish(rig.submit("a", PROMPT, max_tokens=2))  # 5 cached blocks left behind
    low = rig.submit("docs", [1] * 9, max_tokens=20)
    for _ in range(3):
        rig.step()
    high = rig.submit("pair", list(range(40, 68)), max_tokens=4, priority=FOREGROUND)  # 8 blocks
    rig.step()
    assert rig.named(Preempted) and high.blocks
    assert rig.sched.pool.num_cached == 2  # its 7 prompt blocks: the 4 free ones, then 3 of the 5 cached
    assert low.status.resident and low.blocks and not rig.named(SwappedOut)


def test_a_turn_whose_kv_move_failed_starts_over_from_the_cache():
    rig = Rig()
    rig.finish(rig.submit("a", PROMPT))
    turn = rig.submit("b", PROMPT, max_tokens=10)
    for _ in range(3):
        rig.step()
    shared = turn.blocks[:5]
    rig.sched.lose_kv(Plan(), turn.id, rig.now)  # as the GPU owner does when a swap fails
    assert turn.blocks == shared and turn.computed == 20  # never rewrites a shared block
    (event,) = rig.named(Recomputed)
    assert event.cached_tokens == 20 and event.tokens == turn.length - 20
    rig.finish(turn)
    assert rig.sched.pool.num_free == 64


def copy_then_pause_for_memory(policy):
    """A turn admitted with rows copied into a block of its own, then paused in the
    same plan to give the pool's last block to a foreground decode."""
    rig = Rig(policy=policy, slots=3, blocks=4, kv=True)
    first = rig.submit("a", PROMPT[:6], max_tokens=4)
    rig.step()  # its second block holds two rows, noted
    high = rig.submit("pair", [50, 51, 52, 53], max_tokens=5, priority=FOREGROUND)
    rig.step()  # one block, full: its next decode needs the pool's last
    low = rig.submit("b", PROMPT[:6] + [60], max_tokens=3)
    return rig, (first, high, low), rig.step()


def test_rows_copied_for_a_turn_paused_in_the_same_plan_go_to_host_memory_with_it():
    rig, (first, high, low), plan = copy_then_pause_for_memory("swap")
    copy, out = plan.moves
    assert copy == Copy(low.id, first.blocks[1], copy.target) and low.status is Status.SWAPPED
    # The copy runs first, so the swap-out saves the rows it copied; the block is
    # the foreground turn's by the step, which writes it before reading it.
    assert out == SwapOut(low.id, [copy.target], 2) and copy.target in high.blocks
    rig.finish(first, high, low)
    for turn in (first, high, low):
        assert turn.output == reference_output(turn.prompt, turn.max_tokens)
    assert rig.sched.pool.num_free == 4


def test_rows_copied_for_a_turn_dropped_in_the_same_plan_are_not_copied():
    rig, (first, high, low), plan = copy_then_pause_for_memory("recompute")
    # Its K/V is dropped: a copy would fill what is now the foreground turn's block.
    assert low.status is Status.DROPPED and not plan.moves and rig.engine.done["copy"] == 0
    rig.sched.lose_kv(plan, low.id, rig.now)  # as the owner does if a move of it fails (a swap-in, say)
    assert low.status is Status.DROPPED and not low.blocks  # nothing to take back: it starts over at resume
    rig.finish(first, high, low)
    for turn in (first, high, low):
        assert turn.output == reference_output(turn.prompt, turn.max_tokens)
    assert rig.sched.pool.num_free == 4


def test_a_turns_end_says_what_the_engine_computed_and_what_it_reused():
    """The run summary's figures: a turn cancelled mid-prompt computed only part of
    it, a repeat only its last token."""
    from swarm.summary import summarize

    rig = Rig(step_tokens=8)
    first = rig.submit("a", PROMPT)
    rig.step()
    rig.step()
    rig.sched.cancel(first.id, rig.now)
    assert (first.ended.computed_tokens, first.ended.cached_tokens) == (16, 0)
    again = rig.submit("b", PROMPT)
    rig.finish(again)
    assert (again.ended.computed_tokens, again.ended.cached_tokens) == (5, 16)  # 16-20, then 3 decodes
    summary = summarize(rig.events)
    assert (summary.prompt_computed, summary.prompt_reused) == (16 + 5, 16)


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 3), min_size=1, max_size=40),
    named_first=st.integers(0, 10),
    strides=st.lists(st.integers(1, 9), min_size=1, max_size=8),
)
def test_commit_registers_and_notes_what_chain_names_block_by_block(tokens, named_first, strides) -> None:
    """commit registers the blocks a step completes (a fast-forward completes
    many at once), filed and named when first asked about (a turn alone in its
    family defers both, till it lets its blocks go at the latest): the keys
    must be those `chain` gives a fresh turn block by block, each full block
    found under its key and noted under its predecessor's with its tokens,
    and the last partial block noted at `settle`, whatever the turn had named
    before."""
    pool = BlockPool(32, B)
    prefix = PrefixCache(pool)
    turn = Turn(1, "a", BACKGROUND, tokens, 1)
    prefix.chain(turn, min(named_first, len(tokens) // B))  # (as a batch-mate's lookup may have)
    pool.grow(turn.blocks, len(tokens))
    for stride in strides:
        turn.computed = min(turn.computed + stride, len(tokens))
        prefix.commit(turn)
    prefix.settle(turn)  # (as before it lets its blocks go: the pool is asked directly below)
    fresh = Turn(2, "b", BACKGROUND, tokens, 1)
    full = turn.computed // B
    keys = [prefix.chain(fresh, i + 1)[i] for i in range(full)]  # (one block at a time)
    for i, key in enumerate(keys):
        assert pool.lookup(key) == turn.blocks[i]
        assert pool.best_rows(keys[i - 1] if i else prefix.root, tokens[i * B : (i + 1) * B]) == (turn.blocks[i], B)
    assert turn.hashes[:full] == keys and turn.committed == full
    if turn.computed % B:
        rows = tokens[full * B : turn.computed]
        assert pool.noted_rows(turn.blocks[full]) == tuple(rows)


def test_a_turn_alone_in_its_family_names_its_blocks_only_when_asked():
    rig = Rig()
    first = rig.submit("a", PROMPT, max_tokens=8)
    rig.finish(first)
    # Neither its prompt's keys nor its reply's are named (no batch-mate computed
    # the same blocks), until a turn that starts the same way asks.
    assert len(first.hashes) == 0
    rig.finish(rig.submit("b", [99, *PROMPT]))
    assert len(first.hashes) == 0
    again = rig.submit("c", PROMPT + [7] * 8)
    rig.step()
    assert len(first.hashes) == 7 and again.cached_tokens == 28


@settings(max_examples=150, deadline=None)
@given(
    policy=st.sampled_from(["resident", "swap", "recompute", "priority"]),
    blocks=st.sampled_from([10, 16, 64]),
    turns=st.lists(
        st.tuples(
            st.lists(st.integers(10, 12), min_size=1, max_size=13),  # prompts that start alike, or not
            st.integers(1, 9),  # max tokens
            st.booleans(),  # foreground
            st.integers(0, 4),  # steps until it is submitted
        ),
        min_size=1,
        max_size=10,
    ),
)
@example(  # a turn swapped back in registers fresh blocks: its old ones still hold the names
    policy="swap",
    blocks=10,
    turns=[([10], 2, False, 0), ([11] + [10] * 9, 4, False, 0), ([10], 1, True, 1), ([10] * 13, 1, False, 3)],
)
def test_deferred_naming_decides_exactly_as_naming_at_once(policy, blocks, turns) -> None:
    """Naming a lone turn's blocks late (BlockPool, families) changes no decision:
    the same events, the same work on the same blocks, step by step."""
    runs = []
    for defer in (True, False):
        events: list[Event] = []
        config = SchedulerConfig(slots=2, policy=policy, step_tokens=6)
        sched = Scheduler(config, BlockPool(blocks, B, defer_naming=defer), emit=events.append)
        work, now, queue, wait = [], 0.0, list(turns), 0
        for _ in range(400):
            while queue and wait >= queue[0][3]:
                prompt, max_tokens, foreground, _ = queue.pop(0)
                sched.submit("fg" if foreground else "bg", FOREGROUND if foreground else BACKGROUND, prompt, max_tokens, now)
                wait = 0
            wait += 1
            plan = sched.schedule(now)
            work.append([(w.turn, w.start, w.tokens, w.block_table) for w in plan.works] + [repr(m) for m in plan.moves])
            now += 0.01
            sched.postprocess(plan, [7 if w.sample else None for w in plan.works], now)
            if not queue and not sched.turns:
                break
        runs.append(([msgspec.to_builtins(e) for e in events], work))
    assert runs[0] == runs[1]
