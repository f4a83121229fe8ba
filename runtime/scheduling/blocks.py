"""KV block accounting: which of the engine's pool blocks are free, cached or owned.

The scheduler owns this object; the engine owns the memory behind the ids. A turn
holds the blocks covering every position whose K/V has been computed, in order
(its block table). A full block may also be *cached*: registered under the chain
hash of its tokens (runtime.scheduling.prefix), so that a later turn whose prompt starts the
same way takes it by reference instead of computing it again.

Any block, full or not, may also be *noted*: filed under the chain hash of the
blocks before it with the tokens its computed rows hold, so that a turn whose
tokens agree with only the first rows (a finished turn's last block, the start of
a full block) gets a copy of those rows in a block of its own (`best_rows`).

Every block is in exactly one state:

    free     refcount 0, neither hashed     handed out first
             nor noted
    cached   refcount 0, hashed or noted,   handed out (and forgotten) when no free
             in an LRU                      block is left, least recently used first
    owned    refcount >= 1                  held by that many turns' tables

so free + cached + owned == num_blocks, and `num_free` (what `grow` can hand out
without evicting a turn) counts the first two.

Naming a block (its chain hash, its note) is the prefix cache's dearest work, and
most blocks are evicted before any turn asks for them: a block can only serve a
turn whose tokens start the way its own turn's did. So the cache files each
block under a *family* (its turn's first token: every turn that could share the
block starts with it too) and, while a family holds only one turn's blocks, all
held by that turn (or held again: a turn recomputed after a preemption takes
its blocks back), may `defer` naming them. A deferred block is cached in every
respect (released to the LRU, evicted in its order); it is named, with the rest
of its family and in the order they were deferred, by the `namer` the cache
gives, before anything about the family's names is asked or changed (`lookup`
and `best_rows` told the family, `is_cached` and `noted_rows` of it, `register`
and `note` in it; without a family, every family's). While a family is deferred
no other block can take its names (they are its one turn's), so naming late
names exactly what naming at once would have; and a cache that asks first
whether a family has any block (`has_family`) skips the lookups that cannot hit.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable

from runtime.errors import UsageError
from runtime.scheduling.units import ceil_div


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, *, namespace: str = "", defer_naming: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise UsageError(f"need at least one block of at least one position, got {num_blocks} x {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # What the cached K/V depends on besides the tokens (the model): folded into
        # every chain hash, so a pool never serves one model's K/V to another.
        self.namespace = namespace
        self._free: deque[int] = deque(range(num_blocks))
        # Cached, unreferenced blocks, oldest first: a deque, since most blocks
        # leave it from the front. A block taken back out of the middle (a cache
        # hit, `acquire`) leaves a stale entry, counted in `_stale` and skipped
        # when reached: a block's stale entries are all before its live one.
        # (Whether a block nobody holds is in it is `_is_cached`: no flag per block
        # to keep as every block comes and goes.)
        self._lru: deque[int] = deque()
        self._stale = [0] * num_blocks
        self._cached = 0  # blocks in the LRU (its live entries)
        self._refs = [0] * num_blocks
        self._hash_of: dict[int, bytes] = {}
        self._block_of: dict[bytes, int] = {}
        # noted: block -> (parent key, row tokens, its place in the order blocks were first noted)
        self._rows_of: dict[int, tuple[bytes, tuple[int, ...], int]] = {}
        # (parent key, first row's token) -> the blocks noted so: a lookup compares
        # only blocks that agree on a row at least, not every one noted under the
        # key (every turn's first block is noted under the root). With the order
        # each was noted in, `best_rows`' tie-break.
        self._starting: dict[tuple[bytes, int], dict[int, None]] = {}
        self._notes = 0  # blocks first noted so far
        # Families (above): every block filed under one (cached, or deferred), and
        # each family's record; what names deferred blocks is the prefix cache's.
        self._family_of: list[Hashable | None] = [None] * num_blocks  # (by block: a list, read for every block)
        self._families: dict[Hashable, _Family] = {}
        self.defer_naming = defer_naming  # (False: every block is named at once)
        self.namer: Callable[[object, object], tuple[bytes | None, bytes, tuple[int, ...]]] | None = None

    @property
    def num_free(self) -> int:
        """Blocks `grow` can hand out: free ones, then cached ones nobody holds."""
        return len(self._free) + self._cached

    @property
    def num_cached(self) -> int:
        """Cached blocks nobody holds (evictable)."""
        return self._cached

    def refs(self, block: int) -> int:
        return self._refs[block]

    def blocks_for(self, positions: int) -> int:
        """Blocks needed to hold `positions` token positions."""
        return ceil_div(positions, self.block_size)

    # ------------------------------------------------------------ allocation

    def grow(self, table: list[int], positions: int) -> bool:
        """Extend a block table to cover `positions`; False (and no change) if the
        pool is short. Takes free blocks first, then evicts cached ones, LRU first."""
        missing = -(-positions // self.block_size) - len(table)  # (blocks_for, inlined: several calls a step)
        if missing <= 0:
            return True
        if missing > len(self._free) + self._cached:
            return False
        table += self._take(missing)
        return True

    def grow_all(self, tables: list[list[int]], positions: list[int]) -> bool:
        """`grow` each table to its positions, in order, if the pool can cover
        them all; False (and no change) if it cannot. One call for a step's
        turns (Scheduler.repeatable), each taking what `grow` would: the blocks
        are taken at once, and each table has its share in order."""
        size = self.block_size
        missing = [-(-end // size) - len(table) for table, end in zip(tables, positions, strict=True)]
        total = 0
        for n in missing:
            if n > 0:
                total += n
        if not total:
            return True
        if total > len(self._free) + self._cached:
            return False
        taken = self._take(total)
        at = 0
        for table, n in zip(tables, missing, strict=True):
            if n > 0:
                table += taken[at : at + n]
                at += n
        return True

    def _take(self, n: int) -> list[int]:
        """`n` blocks, which the pool has, now owned once: free ones first, then
        cached ones evicted, LRU first."""
        free = self._free
        if len(free) >= n:
            taken = [free.popleft() for _ in range(n)]
        else:
            taken = list(free)
            free.clear()
            self._evict(taken, n - len(taken))
        refs = self._refs
        for block in taken:
            refs[block] = 1
        return taken

    def _evict(self, taken: list[int], n: int) -> None:
        """Append the `n` least recently used cached blocks to `taken`, unnamed
        (`_forget`, inlined for the common case: a block its family deferred,
        named by neither a key nor a note, every other block in the LRU)."""
        hash_of, rows_of, family_of = self._hash_of, self._rows_of, self._family_of
        popleft, stale = self._lru.popleft, self._stale
        self._cached -= n
        # (a turn's blocks reach the LRU together, so they mostly leave it together:
        # a run of one family's blocks is counted off its family at once)
        last, run = None, 0
        for _ in range(n):
            block = popleft()
            while stale[block]:
                stale[block] -= 1
                block = popleft()
            taken.append(block)
            if block in hash_of or block in rows_of:
                if run:
                    self._unfile_run(last, run)
                last, run = None, 0
                self._forget(block)
                continue
            # Unnamed, so filed under a family (else it would be free, not cached),
            # which may have deferred it: its entry there is stale now (_Family).
            family = family_of[block]
            family_of[block] = None
            if family != last:
                if run:
                    self._unfile_run(last, run)
                last, run = family, 0
            run += 1
        if run:
            self._unfile_run(last, run)

    def _unfile_run(self, family: Hashable, n: int) -> None:
        """`n` blocks filed under the family have been evicted: the family
        forgets it held them, and the pool the family once it has none."""
        kin = self._families[family]
        kin.count -= n
        kin.loose -= n
        kin.whole = False
        if not kin.count:
            del self._families[family]

    def release(self, table: list[int]) -> None:
        """Drop a table's references. A block nobody holds any more goes back to the
        free list, or, if hashed, to the cache. The table is released from its end,
        so a turn's last blocks (the least likely to be shared) are evicted first."""
        refs, family_of, lru = self._refs, self._family_of, self._lru
        to_lru, queued = lru.append, len(lru)  # (the blocks cached are counted once, by what the LRU gained)
        # (a table's blocks are mostly one family's: each run of them is counted
        # loose in its family at once)
        last, run = None, 0
        for block in reversed(table):
            held = refs[block] - 1
            if held:  # (still held by another turn; or never taken)
                if held < 0:
                    self._cached += len(lru) - queued
                    self._loosen(last, run)
                    raise ValueError(f"block {block} released more often than it was taken")
                refs[block] = held
                continue
            refs[block] = 0
            family = family_of[block]
            if family is not None:
                if family != last:
                    self._loosen(last, run)
                    last, run = family, 0
                run += 1
                to_lru(block)
            elif block in self._hash_of or block in self._rows_of:
                to_lru(block)
            else:
                self._free.append(block)
        self._cached += len(lru) - queued
        self._loosen(last, run)
        table.clear()

    def _loosen(self, family: Hashable | None, n: int) -> None:
        """`n` blocks filed under the family went to the LRU: nobody holds them
        now, so the turn that filed them no longer holds them all."""
        if n:
            kin = self._families[family]
            kin.loose += n
            kin.held = False

    # ---------------------------------------------------------------- sharing

    def lookup(self, key: bytes, family: Hashable | None = None) -> int | None:
        """The block cached under a chain hash, if it is still there (`family`: the
        one the key's tokens belong to, if known)."""
        self._name_deferred(family)
        return self._block_of.get(key)

    def acquire(self, block: int, owner: object = None) -> None:
        """Take one more reference on a cached or owned block (for `owner`, the
        turn taking it, if known)."""
        if self._refs[block] == 0:
            if not self._is_cached(block):
                raise ValueError(f"block {block} is free: only a cached or owned block can be shared")
            self._stale[block] += 1
            self._cached -= 1
            if len(self._lru) > 2 * self.num_blocks:
                self._drop_stale()
            family = self._family_of[block]
            if family is not None:
                self._hold(family, owner)
        self._refs[block] += 1

    def _hold(self, family: Hashable, owner: object) -> None:
        """A block of the family nobody held is taken: taken by the turn that filed
        them all (recomputed after a preemption), the family may be all held by
        it again."""
        kin = self._families[family]
        kin.loose -= 1
        if owner is None or owner != kin.owner:
            kin.whole = False  # (another turn's, or a pin's: no longer its owner's alone)
        elif not kin.loose and kin.whole:
            kin.held = True

    def _is_cached(self, block: int) -> bool:
        """Whether a block nobody holds is in the LRU, not free: a block goes there,
        and stays till it is evicted, exactly when it is filed under a family or
        named (`release`; `_evict` unfiles and unnames it as it leaves)."""
        return self._family_of[block] is not None or block in self._hash_of or block in self._rows_of

    def _drop_stale(self) -> None:
        """Rebuild the LRU without its stale entries (once they outnumber the
        blocks: a pool whose cache is hit, and never short, would keep them)."""
        stale, live = self._stale, deque()
        for block in self._lru:
            if stale[block]:
                stale[block] -= 1
            else:
                live.append(block)
        self._lru = live

    def register(self, block: int, key: bytes, family: Hashable | None = None, owner: object = None) -> bool:
        """Record that an owned, full block holds the K/V that `key` names (filed
        under `family` for `owner`, its turn, if given). False if another block
        already does (the two were computed side by side; the first stays the
        shared copy, this one stays private)."""
        if self._refs[block] < 1:
            raise ValueError(f"block {block} is not owned: only computed K/V can be cached")
        self._name_deferred(family)
        if self._hash_of.get(block, key) != key:
            raise ValueError(f"block {block} is already cached under another hash")
        known = self._block_of.get(key)
        if known is not None:
            return known == block
        self._block_of[key] = block
        self._hash_of[block] = key
        if family is not None:
            self._file(block, family, owner)
        return True

    def is_cached(self, block: int) -> bool:
        """Hashed: a full block that turns take by reference (so never written)."""
        self._name_block(block)
        return block in self._hash_of

    # -------------------------------------------------------------- families

    def has_family(self, family: Hashable) -> bool:
        """Whether any block is filed under the family (else no lookup of its names can hit)."""
        return family in self._families

    def may_defer(self, family: Hashable, owner: object) -> bool:
        """Whether `owner` may `defer` naming its blocks of the family: every block
        filed under it is the owner's, and the owner still holds them all."""
        if not self.defer_naming:
            return False
        kin = self._families.get(family)
        return kin is None or (kin.owner == owner and kin.held)

    def defer_alone(self, family: Hashable, owner: object, entries: Iterable[tuple[int, object]]) -> bool:
        """Where `may_defer` (else nothing, and False): file owned blocks under
        the family as cached, each to be named as `namer(owner, entry)` says (its
        key, None if only noted; its parent key; its rows) when the family's
        names are next asked or changed. Deferred again, a block is named by its
        latest entry. A turn's blocks after each step, asked once."""
        kin = self._families.get(family)
        if kin is None:
            if not self.defer_naming:
                return False
            kin = self._families[family] = _Family(owner)
        elif not (kin.owner == owner and kin.held and self.defer_naming):
            return False
        refs, family_of, deferred = self._refs, self._family_of, kin.deferred
        filed = 0  # (counted once, not block by block: nearly every block is new to the family)
        for block, entry in entries:
            if refs[block] < 1:
                kin.count += filed
                raise ValueError(f"block {block} is not owned: only computed K/V can be cached")
            if family_of[block] is None:
                family_of[block] = family
                filed += 1
            deferred[block] = entry  # (no stale entry to drop: one held is never evicted, _Family)
        kin.count += filed
        return True

    def defer_one(self, family: Hashable, owner: object, block: int, entry: object) -> bool:
        """`defer_alone` of one block: a turn's last, partly computed block, noted
        anew at every `settle` (PrefixCache), for every running turn."""
        kin = self._families.get(family)
        if kin is None:
            return self.defer_alone(family, owner, ((block, entry),))
        if not (kin.owner == owner and kin.held and self.defer_naming):
            return False
        if self._refs[block] < 1:
            raise ValueError(f"block {block} is not owned: only computed K/V can be cached")
        if self._family_of[block] is None:
            self._family_of[block] = family
            kin.count += 1
        kin.deferred[block] = entry
        return True

    def _file(self, block: int, family: Hashable, owner: object) -> _Family:
        kin = self._families.get(family)
        if kin is None:
            kin = self._families[family] = _Family(owner)
        elif kin.owner != owner:
            kin.owner = _SHARED  # (named at once from now on)
        if self._family_of[block] is None:
            self._family_of[block] = family
            kin.count += 1
        return kin

    def _name_deferred(self, family: Hashable | None) -> None:
        """Name the family's deferred blocks (every family's, for None), in the
        order deferred."""
        families = self._families
        kins = families.items() if family is None else [(family, families[family])] if family in families else []
        family_of = self._family_of
        for filed, kin in kins:
            if kin.deferred:
                deferred, kin.deferred = kin.deferred, {}
                for block, entry in deferred.items():
                    if family_of[block] != filed:
                        continue  # (evicted since: a stale entry)
                    key, parent, rows = self.namer(kin.owner, entry)
                    if key is not None:
                        self._block_of[key] = block
                        self._hash_of[block] = key
                    self._note(block, parent, rows)

    def _name_block(self, block: int) -> None:
        """Name the block's family if the block is deferred."""
        family = self._family_of[block]
        if family is not None and block in self._families[family].deferred:
            self._name_deferred(family)

    def note(self, block: int, parent: bytes, rows: tuple[int, ...], family: Hashable | None = None, owner: object = None) -> None:
        """Record that an owned block's first rows hold the K/V of `rows`, the
        tokens that follow the blocks `parent` names (filed under `family` for
        `owner`, its turn, if given). Noted again as its turn computes more, so
        the rows only ever grow."""
        if self._refs[block] < 1:
            raise ValueError(f"block {block} is not owned: only computed K/V can be noted")
        self._name_deferred(family)
        self._note(block, parent, rows)
        if family is not None:
            self._file(block, family, owner)

    def _note(self, block: int, parent: bytes, rows: tuple[int, ...]) -> None:
        old = self._rows_of.get(block)
        if old is None:
            order = self._notes
            self._notes += 1
        elif old[0] != parent:
            raise ValueError(f"block {block} is already noted under another parent")
        else:
            order = old[2]
        first = rows[0] if rows else None
        if old is None or (old[1][0] if old[1] else None) != first:
            if old is not None:
                self._unfile_first(block, old)
            if rows:
                self._starting.setdefault((parent, first), {})[block] = None
        self._rows_of[block] = (parent, rows, order)

    def noted_rows(self, block: int) -> tuple[int, ...]:
        """The tokens a noted block's rows hold (empty if it is not noted)."""
        self._name_block(block)
        noted = self._rows_of.get(block)
        return noted[1] if noted else ()

    def best_rows(self, parent: bytes, tokens: list[int], family: Hashable | None = None) -> tuple[int | None, int]:
        """The noted block under `parent` whose rows agree longest with `tokens`
        from its first row, and for how many rows (None, 0 if none does).
        `family`: the one the tokens belong to, if known."""
        self._name_deferred(family)
        best, most = None, 0
        if not tokens:
            return best, most
        # (only blocks whose first row agrees can agree for any rows; among equals,
        # the one noted first under the key wins)
        rows_of = self._rows_of
        for block in self._starting.get((parent, tokens[0]), ()):
            rows = rows_of[block][1]
            n = 0
            for a, b in zip(rows, tokens, strict=False):
                if a != b:
                    break
                n += 1
            if n > most or (n == most and best is not None and rows_of[block][2] < rows_of[best][2]):
                best, most = block, n
        return best, most

    def _forget(self, block: int) -> None:
        """An evicted block's K/V is about to be overwritten: unname it."""
        key = self._hash_of.pop(block, None)
        if key is not None:
            del self._block_of[key]
        noted = self._rows_of.pop(block, None)
        if noted is not None:
            self._unfile_first(block, noted)
        family = self._family_of[block]
        if family is not None:
            self._family_of[block] = None
            kin = self._families[family]
            kin.deferred.pop(block, None)
            kin.count -= 1
            kin.loose -= 1
            kin.whole = False
            if not kin.count:
                del self._families[family]

    def _unfile_first(self, block: int, noted: tuple[bytes, tuple[int, ...], int]) -> None:
        parent, rows, _ = noted
        if not rows:
            return
        starting = self._starting[parent, rows[0]]
        del starting[block]
        if not starting:
            del self._starting[parent, rows[0]]


_SHARED = object()  # a family's owner once two turns have filed blocks under it


class _Family:
    """What the pool knows of one family: how many blocks are filed under it and
    how many of those nobody holds (`loose`, in the LRU), the turn that filed them
    all (`_SHARED` once there are two), whether that turn still holds them all
    (`held`), and the blocks it has yet to name, in the order deferred. A turn
    that lets its blocks go stops holding them; one that takes them all back
    (recomputed after a preemption) holds them again, while the family is
    `whole`: none of its blocks evicted, and none nobody held taken by anyone
    else.
    A deferred block evicted keeps its entry, stale (the eviction, from the LRU's
    cold end, leaves the family's dict alone): naming skips a block no longer
    filed under the family. A stale entry is never in the way of a block
    deferred anew: only a block nobody holds is evicted, so a family with one
    has stopped being held, and, no longer whole, defers no more; filed again
    otherwise (`register`, `note`), a block is filed after its family's deferred
    blocks are named, and the stale entries with them dropped."""

    __slots__ = ("count", "loose", "owner", "held", "whole", "deferred")

    def __init__(self, owner: object) -> None:
        self.count = 0
        self.loose = 0
        self.owner = owner
        self.held = True
        self.whole = True
        self.deferred: dict[int, object] = {}
