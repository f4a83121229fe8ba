"""Prefix reuse: a turn whose tokens start the way an earlier turn's did takes that
turn's K/V blocks by reference and computes only the rest.

A full block is named by a chain hash: block i's key hashes block i-1's key and
block i's tokens, starting from a root that folds in the pool's namespace (the
model) and the block size. So equal keys mean equal tokens at equal positions
from position 0, which is all a block's K/V depends on; sampling settings do not
enter (K/V is computed before any sampling). An agent's next turn that repeats its
conversation so far hits the blocks of the previous turn, prompt and reply alike,
without being told to.

Only full blocks whose every position has been computed are registered, and a
turn always computes at least its last prompt token itself, so the block it
writes into is its own: shared blocks are never written, and no copy-on-write is
needed. Where a turn's tokens part from every cached full block, the rows they
still share with some block (the last, partly filled block of a finished turn,
or the start of a full one) are copied on the device into a fresh block of the
turn's own (`copy_rows`): a repeated prompt computes only its last token.

Only a turn that starts with the same token can use a block, so the pool files
blocks by their turn's first token, and a turn alone in its family defers naming
its blocks until a turn of the family asks (BlockPool, families): most are
evicted unnamed, and no decision changes. Such a turn does not even file its
blocks as it computes them: it files what it has committed only when its
family is next asked about or changed, or it lets its blocks go (`_file_alone`).
Until then no other turn can ask for them, so filing late files exactly what
filing at every step would have; and most turns file their blocks once, not
once a step.
"""

from __future__ import annotations

import hashlib
from array import array

from runtime.scheduling.blocks import BlockPool
from runtime.scheduling.inflight import InFlight
from runtime.scheduling.turns import Copy, Turn


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


class PrefixCache:
    """The scheduler's hooks into a sharing BlockPool: `reuse` at admission,
    `commit` after each step, `shared_blocks` / `restore` around a swap."""

    def __init__(self, pool: BlockPool, enabled: bool = True, in_flight: InFlight | None = None) -> None:
        self.pool = pool
        self.block_size = pool.block_size
        self.enabled = enabled
        # The scheduler's steps in flight: a turn's K/V is only shared once it has
        # landed, and what a prompt takes from the cache continues what they write.
        self.in_flight = in_flight if in_flight is not None else InFlight()
        self.root = _digest(f"slotswarm kv\0{pool.namespace}\0{pool.block_size}".encode())
        self._unsettled: dict[int, Turn] = {}  # turns whose last block's note is behind (`settle`)
        # By family: the turn alone in it whose committed blocks are not all filed
        # yet (`commit`), and what it has to file (`_Alone`, `_file_alone`).
        self._unfiled: dict[int, _Alone] = {}
        pool.namer = self._name

    @staticmethod
    def family(turn: Turn) -> int:
        """What the pool files the turn's blocks under (BlockPool, families): its
        first token, which every turn whose tokens its blocks could serve shares."""
        return turn.prompt[0]

    def chain(self, turn: Turn, n: int) -> list[bytes]:
        """The keys of the turn's first `n` full blocks (kept on the turn)."""
        return self._named(turn, n)[:n]

    def _named(self, turn: Turn, n: int) -> list[bytes]:
        """The turn's keys, at least its first `n` named: `chain` without the copy."""
        keys = turn.hashes
        if len(keys) < n:
            size = self.block_size
            parent = keys[-1] if keys else self.root
            for i in range(len(keys), n):
                parent = _digest(parent + array("q", turn.tokens(i * size, (i + 1) * size)).tobytes())
                keys.append(parent)
        return keys

    def parent(self, turn: Turn, i: int) -> bytes:
        """The key block i of the turn is filed under: its predecessor's, or the root."""
        if not i:
            return self.root
        keys = turn.hashes  # (asked after every step: no copy of the chain when it is there)
        return keys[i - 1] if len(keys) >= i else self._named(turn, i)[i - 1]

    def reuse(self, turn: Turn, moves: list | None = None) -> int:
        """Give a turn that holds no K/V what the cache has of its tokens (leaving
        it at least one token to compute); the positions reused. With `moves`, the
        plan's KV moves, that includes rows copied into a block of its own."""
        assert not turn.blocks and turn.computed == 0, "reuse is for a turn without K/V"
        turn.committed = 0
        return self.extend(turn) + (self.copy_rows(turn, moves) if moves is not None else 0)

    def extend(self, turn: Turn) -> int:
        """Take by reference the cached full blocks that continue a turn's K/V, if
        it ends on a block boundary: at admission, or while it prefills, blocks a
        batch-mate with the same prefix has just computed. The positions gained."""
        size = self.block_size
        start = turn.computed
        if not self.enabled or start != len(turn.blocks) * size or (self.in_flight.launched and self.in_flight.writing(turn)):
            # (a step in flight still writes its last blocks, which are committed
            # when it lands; it catches up after that)
            return 0
        want = turn.reusable_blocks(size)
        if want <= len(turn.blocks):
            return 0
        # (named only where a block may hit: `Batching` names the rest when it compares them)
        family = self.family(turn)
        for key in self._named(turn, want)[len(turn.blocks) : want] if self._others_filed(family, turn) else ():
            block = self.pool.lookup(key, family)
            if block is None:
                break
            self.pool.acquire(block, turn)
            turn.blocks.append(block)
        turn.committed = len(turn.blocks)
        turn.computed = len(turn.blocks) * size
        turn.cache_hits += turn.computed - start
        return turn.computed - start

    def copy_rows(self, turn: Turn, moves: list) -> int:
        """Past the shared full blocks: if some block (a finished turn's last, the
        start of a full one) holds rows that continue the turn's tokens, give the
        turn a block of its own with a device copy of it (a `Copy` move), or that
        block itself where that loses nothing, so only the rest is computed. The
        positions gained."""
        size = self.block_size
        ahead = self.in_flight.of(turn)  # (InFlight.computed and .length, from the one share)
        start, last = turn.computed + ahead.positions, len(turn.prompt) + len(turn.output) + ahead.tokens - 1
        if not self.enabled or start != len(turn.blocks) * size or start >= last:
            return 0
        i = len(turn.blocks)
        self.settle()
        family = self.family(turn)
        if not self._others_filed(family, turn):
            return 0  # (no other turn's block shares its first token, so none its rows)
        source, rows = self.pool.best_rows(self.parent(turn, i), turn.tokens(start, min(start + size, last)), family)
        if source is None:
            return 0
        noted = self.pool.noted_rows(source)
        if self.pool.refs(source) == 0 and not self.pool.is_cached(source) and list(noted) == turn.tokens(start, start + len(noted)):
            # Nobody holds it and every row it holds is one of the turn's own (a
            # finished turn's last block, for a repeated prompt): take the block
            # itself; what the turn writes past the rows loses nothing cached.
            self.pool.acquire(source, turn)
            turn.blocks.append(source)
        else:
            if not self._copy(turn, source, moves):
                return 0
        turn.computed += rows  # (past what a step in flight writes: it lands before the copy runs)
        turn.cache_hits += rows
        return rows

    def _copy(self, turn: Turn, source: int, moves: list) -> bool:
        """A fresh block for the turn, filled from `source` by a `Copy` move;
        False if the pool has none to spare."""
        pin = [source]  # held while a block is found, so the search cannot evict it
        self.pool.acquire(source)
        grown = self.pool.grow(turn.blocks, (len(turn.blocks) + 1) * self.block_size)
        self.pool.release(pin)
        if grown:
            moves.append(Copy(turn.id, source, turn.blocks[-1]))
        return grown

    def commit(self, turn: Turn) -> None:
        """Register the turn's newly computed full blocks; its last, partly
        computed one is noted at the next `settle`. A turn alone in its family
        (one the pool lets defer naming) files them later (`_file_alone`)."""
        if not self.enabled:
            return
        size = self.block_size
        landed = turn.computed  # (K/V a step in flight writes is not there to share yet)
        held = len(turn.blocks)
        full = landed // size  # turn.full_blocks, inlined: once a step per turn
        if full > held:
            full = held
        if full > turn.committed:
            family = turn.prompt[0]  # (self.family, inlined)
            alone = self._unfiled.get(family)
            if alone is None or alone.turn is not turn:  # (else it is alone already: nothing to do till it files)
                if alone is not None:
                    self._file_alone(family)  # (another turn's, committed first: filed first)
                if self.pool.may_defer(family, turn):
                    self._unfiled[family] = _Alone(turn, turn.committed)
                else:
                    self._register(turn, full)
            turn.committed = full
        if full < held and landed > full * size:
            self._unsettled[turn.id] = turn

    def _others_filed(self, family: int, turn: Turn) -> bool:
        """Whether a turn other than this one has filed blocks in its family: else
        no block can continue its K/V (its own blocks are at positions it has
        computed, never the ones it asks for), and the pool is not asked. (A
        prompt alone in its family, catching up between its chunks, would name
        its own blocks at every chunk for nothing.)"""
        alone = self._unfiled.get(family)
        if alone is not None and alone.turn is turn:
            return False  # (alone and filing late: nobody else has filed there since)
        self._asking(family)
        return self.pool.has_family(family) and not self.pool.may_defer(family, turn)

    def _asking(self, family: int) -> None:
        """The family is about to be asked about or changed: a turn alone in it
        files what it has committed first."""
        if family in self._unfiled:
            self._file_alone(family)

    def _file_alone(self, family: int) -> None:
        """File the blocks the turn alone in the family has committed since it
        last filed, as deferred (BlockPool.defer_alone), and its last block as
        `settle` last noted it: what `commit` and `settle` would have filed step
        by step. Nobody else has filed in the family since (whoever would have
        files after it, `_asking`), so it still may; and the order its own
        blocks are filed in decides nothing (no two share a predecessor)."""
        alone = self._unfiled.pop(family)
        turn, filed, noted, size = alone.turn, alone.filed, alone.noted, self.block_size
        committed = turn.committed
        if committed > filed:
            # (each block's entry is its index, `_name`)
            deferred = self.pool.defer_alone(family, turn, zip(turn.blocks[filed:committed], range(filed, committed), strict=True))
            assert deferred, "a turn alone in its family may defer naming its blocks"
        if noted and -noted // size >= committed:  # (a block noted partly computed, and not full since)
            deferred = self.pool.defer_one(family, turn, turn.blocks[-noted // size], noted)
            assert deferred, "a turn alone in its family may defer naming its blocks"

    def _register(self, turn: Turn, full: int) -> None:
        """Register (and note) the turn's blocks from its first uncommitted one to
        `full`, naming those `chain` has not yet: each block's tokens are read
        once, for its key and its note alike (a fast-forward commits many)."""
        size, keys, blocks, pool, tokens = self.block_size, turn.hashes, turn.blocks, self.pool, turn.tokens
        first, family = turn.committed, self.family(turn)
        parent = self.parent(turn, first)
        for i in range(first, full):
            rows = tokens(i * size, (i + 1) * size)
            if i < len(keys):
                key = keys[i]
            else:
                key = _digest(parent + array("q", rows).tobytes())
                keys.append(key)
            if pool.register(blocks[i], key, family, turn):
                pool.note(blocks[i], parent, tuple(rows), family, turn)
            parent = key
        turn.committed = full

    def settle(self, turn: Turn | None = None) -> None:
        """Note the rows of partly computed last blocks as they stand now: one
        turn's, before it lets its blocks go (filing what it committed, if it is
        alone in its family); every turn's, before a lookup reads the notes
        (`copy_rows`). A running turn's last block gains a row every step, and
        nobody looks at most steps: noting it only when asked saved half of
        `postprocess`."""
        if turn is not None:
            self._file_own(turn)
            if self._unsettled.pop(turn.id, None) is not None:
                self._note_last(turn)
            return
        size, unfiled = self.block_size, self._unfiled
        for unsettled in self._unsettled.values():
            alone = unfiled.get(unsettled.prompt[0])
            if alone is not None and alone.turn is unsettled:
                # Alone in its family: its note waits till it files (`_note_last`,
                # inlined for every running turn at nearly every settle).
                landed = unsettled.computed
                if landed % size and landed // size < len(unsettled.blocks):
                    alone.noted = -landed
            else:
                self._note_last(unsettled)
        self._unsettled.clear()

    def unsettle(self, turn: Turn) -> None:
        """The turn's K/V is not to be trusted: its last block is not noted
        (the full blocks it committed are filed, as they would have been at once)."""
        self._file_own(turn)
        self._unsettled.pop(turn.id, None)

    def _file_own(self, turn: Turn) -> None:
        """Before the turn lets its blocks go: file what it committed, if it is
        alone in its family and has not yet."""
        alone = self._unfiled.get(turn.prompt[0]) if turn.prompt else None
        if alone is not None and alone.turn is turn:
            self._file_alone(turn.prompt[0])

    def _note_last(self, turn: Turn) -> None:
        size = self.block_size
        landed = turn.computed
        full = landed // size
        if full < len(turn.blocks) and landed > full * size:  # (nothing, if it has let its blocks go)
            family = self.family(turn)
            alone = self._unfiled.get(family)
            if alone is not None:
                if alone.turn is turn:  # (alone in its family: noted as it files)
                    alone.noted = -landed
                    return
                self._file_alone(family)  # (another turn's blocks, committed before: filed first)
            if not self.pool.defer_one(family, turn, turn.blocks[full], -landed):  # (`_name`)
                self.pool.note(turn.blocks[full], self.parent(turn, full), tuple(turn.tokens(full * size, landed)), family, turn)

    def _name(self, turn: Turn, entry: int) -> tuple[bytes | None, bytes, tuple[int, ...]]:
        """What a deferred block of the turn is named (BlockPool.defer_alone): its
        `entry` is the index of a full block, or minus the positions computed
        of the partly computed one they end in."""
        size = self.block_size
        if entry >= 0:
            i = entry
            return self._named(turn, i + 1)[i], self.parent(turn, i), tuple(turn.tokens(i * size, (i + 1) * size))
        landed = -entry
        i = landed // size
        return None, self.parent(turn, i), tuple(turn.tokens(i * size, landed))

    # ------------------------------------------------------------------ swap

    def shared_blocks(self, turn: Turn, n: int) -> list[int]:
        """Indices among the turn's first `n` blocks that a swap-out need not copy:
        cached blocks another turn also holds, so they stay on the device anyway."""
        pool = self.pool
        if turn.blocks:
            self._asking(self.family(turn))
        return [i for i, block in enumerate(turn.blocks[:n]) if pool.refs(block) > 1 and pool.is_cached(block)]

    def restore(self, turn: Turn, kept: list[int]) -> list[int] | None:
        """Take back, by their keys, the blocks a swap-out left on the device; None
        (and nothing taken) if one has been evicted since."""
        if not kept:
            return []
        keys = self.chain(turn, max(kept) + 1)
        self._asking(self.family(turn))
        blocks = [self.pool.lookup(keys[i], self.family(turn)) for i in kept]
        if None in blocks:
            return None
        for block in blocks:
            self.pool.acquire(block)
        return blocks


class _Alone:
    """A turn alone in its family, filing late (PrefixCache.commit): how many of
    its leading blocks it has filed, and how `settle` last noted its partly
    computed last block (minus its positions computed; 0 if it has not since
    the turn last filed)."""

    __slots__ = ("turn", "filed", "noted")

    def __init__(self, turn: Turn, filed: int) -> None:
        self.turn = turn
        self.filed = filed
        self.noted = 0
