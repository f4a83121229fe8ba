"""The block pool with sharing: a hypothesis state machine against a plain model of
it (tables of block ids, the keys of cached blocks, the rows noted in blocks, an
LRU list), and a few scenarios."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from runtime.scheduling.blocks import BlockPool

BLOCKS = 10


class PoolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(BLOCKS, 4)
        self.tables: list[list[int]] = []
        self.key_of: dict[int, bytes] = {}  # what the model expects cached
        self.lru: list[int] = []  # unreferenced cached blocks, oldest first
        self.rows_of: dict[int, tuple[bytes, tuple[int, ...]]] = {}  # noted blocks: (parent, rows)

    def indexed(self, block) -> bool:
        return block in self.key_of or block in self.rows_of

    def held(self) -> Counter:
        return Counter(b for t in self.tables for b in t)

    @rule(n=st.integers(1, 4))
    def new_table(self, n):
        self.tables.append([])
        self.grow(len(self.tables) - 1, n)

    @precondition(lambda self: self.tables)
    @rule(data=st.data(), n=st.integers(1, 3))
    def grow_table(self, data, n):
        self.grow(data.draw(st.integers(0, len(self.tables) - 1)), n)

    def grow(self, index, n):
        table = self.tables[index]
        before = list(table)
        available = BLOCKS - len(self.held())
        free_first = BLOCKS - len(self.held()) - len(self.lru)  # never-hashed free blocks
        ok = self.pool.grow(table, (len(table) + n) * 4)
        assert ok == (n <= available)
        if not ok:
            assert table == before
            return
        new = table[len(before) :]
        evicted = [b for b in new if self.indexed(b)]
        # Free blocks go first, then the least recently used cached ones, in order.
        assert len(evicted) == max(0, n - free_first)
        assert evicted == self.lru[: len(evicted)]
        for b in evicted:
            self.key_of.pop(b, None)
            self.rows_of.pop(b, None)
        self.lru = self.lru[len(evicted) :]

    @precondition(lambda self: any(self.tables))
    @rule(data=st.data(), parent=st.sampled_from([b"p0", b"p1"]), rows=st.lists(st.integers(0, 2), min_size=1, max_size=4))
    def note(self, data, parent, rows):
        """A turn's block holds computed rows after `parent`'s blocks (a partial or full block)."""
        table = data.draw(st.sampled_from([t for t in self.tables if t]))
        block = data.draw(st.sampled_from(table))
        if block in self.rows_of and self.rows_of[block][0] != parent:
            with pytest.raises(ValueError, match="another parent"):
                self.pool.note(block, parent, tuple(rows))
            return
        self.pool.note(block, parent, tuple(rows))
        self.rows_of[block] = (parent, tuple(rows))

    @rule(parent=st.sampled_from([b"p0", b"p1", b"p2"]), tokens=st.lists(st.integers(0, 2), min_size=1, max_size=4))
    def best_rows(self, parent, tokens):
        """The longest agreement from the first row among the blocks noted under
        parent, by a scan of them all (the pool looks only at those whose first
        row agrees); of equals, the one noted first."""

        def agree(rows):
            n = 0
            while n < min(len(rows), len(tokens)) and rows[n] == tokens[n]:
                n += 1
            return n

        most = max((agree(rows) for p, rows in self.rows_of.values() if p == parent), default=0)
        block, n = self.pool.best_rows(parent, tokens)
        assert n == most
        if most:
            # (the model's dict keeps the order blocks were first noted in)
            assert block == next(b for b, (p, rows) in self.rows_of.items() if p == parent and agree(rows) == most)
        else:
            assert block is None

    @precondition(lambda self: self.key_of or self.rows_of)
    @rule(data=st.data())
    def share(self, data):
        """A new table takes a cached block by its key (the prefix cache's hit), or
        holds a noted one while it copies its rows."""
        block = data.draw(st.sampled_from(sorted(set(self.key_of) | set(self.rows_of))))
        if block in self.key_of:
            assert self.pool.lookup(self.key_of[block]) == block
        self.pool.acquire(block)
        if block in self.lru:
            self.lru.remove(block)
        self.tables.append([block])

    @precondition(lambda self: any(self.tables))
    @rule(data=st.data(), key=st.integers(0, 5))
    def register(self, data, key):
        table = data.draw(st.sampled_from([t for t in self.tables if t]))
        block = data.draw(st.sampled_from(table))
        name = b"k%d" % key
        holder = next((b for b, k in self.key_of.items() if k == name), None)
        if block in self.key_of and self.key_of[block] != name:
            with pytest.raises(ValueError, match="already cached"):
                self.pool.register(block, name)
            return
        assert self.pool.register(block, name) == (holder in (None, block))
        if holder is None:
            self.key_of[block] = name

    @precondition(lambda self: self.tables)
    @rule(data=st.data())
    def release(self, data):
        table = self.tables.pop(data.draw(st.integers(0, len(self.tables) - 1)))
        held = self.held()
        for block in reversed(table):  # the table's end becomes the oldest
            if held[block] == 0 and self.indexed(block) and block not in self.lru:
                self.lru.append(block)
        self.pool.release(table)
        assert table == []

    @rule(block=st.integers(0, BLOCKS - 1))
    def misuse_is_refused(self, block):
        """Releasing an unheld block would drive its count negative; registering it
        would cache K/V nobody computed; a free block cannot be shared."""
        if self.pool.refs(block):
            return
        with pytest.raises(ValueError, match="released more often"):
            self.pool.release([block])
        with pytest.raises(ValueError, match="not owned"):
            self.pool.register(block, b"x")
        with pytest.raises(ValueError, match="not owned"):
            self.pool.note(block, b"p0", (1,))
        if not self.indexed(block):
            with pytest.raises(ValueError, match="is free"):
                self.pool.acquire(block)

    @invariant()
    def every_block_is_free_cached_or_owned(self):
        held = self.held()
        free = cached = owned = 0
        for b in range(BLOCKS):
            refs = self.pool.refs(b)
            assert refs == held[b] >= 0
            if refs:
                owned += 1
            elif self.indexed(b):
                cached += 1
            else:
                free += 1
        assert free + cached + owned == BLOCKS
        assert cached == self.pool.num_cached == len(self.lru)
        assert self.pool.num_free == free + cached
        for b, key in self.key_of.items():
            assert self.pool.is_cached(b) and self.pool.lookup(key) == b

    def teardown(self):
        for table in self.tables:
            self.pool.release(table)
        assert self.pool.num_free == BLOCKS and all(self.pool.refs(b) == 0 for b in range(BLOCKS))


TestPool = PoolMachine.TestCase
TestPool.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


def test_a_cached_block_outlives_its_turn_until_the_pool_needs_it():
    pool = BlockPool(3, 4)
    table: list[int] = []
    pool.grow(table, 8)
    pool.register(table[0], b"a")
    pool.release(table)
    assert pool.num_free == 3 and pool.num_cached == 1 and pool.lookup(b"a") is not None
    other: list[int] = []
    assert pool.grow(other, 8)  # the two never-hashed blocks first
    assert pool.lookup(b"a") is not None
    assert pool.grow(other, 12)  # then the cached one is evicted
    assert pool.lookup(b"a") is None and pool.num_free == 0


def test_a_block_hit_many_times_keeps_the_lru_order_and_its_size():
    # Every hit takes a cached block out of the middle of the LRU; a pool that is
    # never short must not keep a trace of each (nor evict in another order).
    pool = BlockPool(3, 4)
    tables: list[list[int]] = [[], []]
    pool.grow(tables[0], 4)
    pool.grow(tables[1], 4)
    a, b = tables[0][0], tables[1][0]
    pool.register(a, b"a")
    pool.register(b, b"b")
    pool.release(tables[0])
    pool.release(tables[1])
    for _ in range(50):  # a, then b, each hit and let go: a is the oldest again
        for key in (b"a", b"b"):
            block = pool.lookup(key)
            assert block is not None
            pool.acquire(block)
            pool.release([block])
        assert pool.num_cached == 2 and pool.num_free == 3
    assert len(pool._lru) <= 2 * pool.num_blocks + 1
    taken: list[int] = []
    assert pool.grow(taken, 8)  # the free block, then the least recently used
    assert taken[1] == a and pool.lookup(b"a") is None and pool.lookup(b"b") == b
    assert pool.grow(taken, 12) and taken[2] == b and pool.num_free == 0


def test_a_second_copy_of_a_key_stays_private():
    pool = BlockPool(2, 4)
    a: list[int] = []
    b: list[int] = []
    pool.grow(a, 4)
    pool.grow(b, 4)
    assert pool.register(a[0], b"k") and not pool.register(b[0], b"k")
    assert pool.lookup(b"k") == a[0] and not pool.is_cached(b[0])


notes_strategy = st.lists(
    st.tuples(st.integers(0, BLOCKS - 1), st.sampled_from([b"p0", b"p1"]), st.lists(st.integers(0, 1), max_size=3)), max_size=20
)


@settings(max_examples=300, deadline=None)
@given(first=notes_strategy, taken=st.integers(0, BLOCKS), then=notes_strategy, tokens=st.lists(st.integers(0, 1), max_size=3))
def test_best_rows_picks_what_a_scan_of_every_noted_block_picks(first, taken, then, tokens) -> None:
    """The pool looks only at the blocks whose first row agrees; a scan of all
    of them in the order they were first noted, keeping the first of the
    longest agreements, must pick the same block, whatever was noted again
    (rows that change) or evicted and noted anew."""
    pool = BlockPool(BLOCKS, 4)
    rows_of: dict[int, tuple[bytes, tuple[int, ...]]] = {}  # the model, in the order first noted

    def note(table, notes):
        for block, parent, rows in notes:
            if block not in table or (block in rows_of and rows_of[block][0] != parent):
                continue
            pool.note(block, parent, tuple(rows))
            rows_of[block] = (parent, tuple(rows))

    table: list[int] = []
    pool.grow(table, BLOCKS * 4)
    note(table, first)
    pool.release(table)
    pool.grow(table, taken * 4)  # the free blocks, then the least recently used noted ones
    for block in table:
        rows_of.pop(block, None)  # (evicted: its note is gone)
    note(table, then)

    def agree(rows):
        n = 0
        while n < min(len(rows), len(tokens)) and rows[n] == tokens[n]:
            n += 1
        return n

    for parent in (b"p0", b"p1"):
        scanned, most = None, 0
        for block, (p, rows) in rows_of.items():
            if p == parent and agree(rows) > most:
                scanned, most = block, agree(rows)
        assert pool.best_rows(parent, tokens) == (scanned, most)


def test_defer_one_does_what_defer_alone_does_with_one_block():
    """The settle's shortcut (BlockPool.defer_one) files, refuses and names as
    `defer_alone` of that one block does: alone, with another owner in the
    family, once its owner has let the blocks go."""

    def drive(defer) -> list:
        pool = BlockPool(8, 4)
        pool.namer = lambda owner, entry: (None, b"root", entry)
        seen = []
        mine: list[int] = []
        theirs: list[int] = []
        pool.grow(mine, 12)
        pool.grow(theirs, 4)
        seen.append(defer(pool, "f", "a", mine[0], (1,)))  # a new family
        seen.append(defer(pool, "f", "a", mine[0], (1, 2)))  # again: named by its latest entry
        seen.append(defer(pool, "f", "a", mine[1], (3,)))
        seen.append(defer(pool, "f", "b", theirs[0], (4,)))  # another owner: refused
        seen.append(defer(pool, "g", "b", theirs[0], (5,)))
        pool.release(theirs)
        seen.append(defer(pool, "g", "b", mine[2], (6,)))  # its owner let its blocks go: refused
        seen.append((pool.has_family("f"), pool.has_family("g"), pool.num_cached))
        seen.append([pool.noted_rows(b) for b in range(8)])  # (names every deferred block)
        return seen

    def alone(pool, family, owner, block, entry):
        return pool.defer_alone(family, owner, [(block, entry)])

    def one(pool, family, owner, block, entry):
        return pool.defer_one(family, owner, block, entry)

    assert drive(one) == drive(alone)


def test_a_turn_that_takes_back_all_its_blocks_defers_naming_again():
    """A family's owner that lets its blocks go (a preempted turn, dropped) and
    takes them all back (recomputed) may defer again: unless one of them was
    evicted meanwhile, or taken by anyone else."""

    def family_after(*steps: str) -> bool:
        pool = BlockPool(6, 4)
        pool.namer = lambda owner, entry: (None, b"root", (entry,))
        mine: list[int] = []
        pool.grow(mine, 12)
        assert pool.defer_alone("f", "a", [(block, i) for i, block in enumerate(mine)])
        kept = mine[:]
        pool.release(mine)
        assert not pool.may_defer("f", "a")
        for step in steps:
            if step == "evict":  # the pool runs short: the oldest cached block goes
                pool.grow([], 4 * (pool.num_free - pool.num_cached + 1))
                kept.remove(next(b for b in kept if not pool.noted_rows(b)))
            if step == "other":  # another turn takes one by reference
                pool.acquire(kept.pop(), "b")
            if step == "pin":  # a copy's source, held while its target is found
                pool.acquire(kept[0])
                pool.release([kept[0]])
        for block in kept:
            pool.acquire(block, "a")
        return pool.may_defer("f", "a")

    assert family_after()
    assert not family_after("evict")
    assert not family_after("other")
    assert not family_after("pin")
