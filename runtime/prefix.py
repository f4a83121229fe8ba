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
needed.
"""

from __future__ import annotations

import hashlib
from array import array

from runtime.blocks import BlockPool
from runtime.turns import Turn


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


class PrefixCache:
    """The scheduler's hooks into a sharing BlockPool: `reuse` at admission,
    `commit` after each step, `shared_blocks` / `restore` around a swap."""

    def __init__(self, pool: BlockPool, enabled: bool = True) -> None:
        self.pool = pool
        self.enabled = enabled
        self.root = _digest(f"slotswarm kv\0{pool.namespace}\0{pool.block_size}".encode())

    def chain(self, turn: Turn, n: int) -> list[bytes]:
        """The keys of the turn's first `n` full blocks (kept on the turn)."""
        keys = turn.hashes
        if len(keys) < n:
            size = self.pool.block_size
            tokens = turn.prompt if n * size <= len(turn.prompt) else turn.prompt + turn.output
            parent = keys[-1] if keys else self.root
            for i in range(len(keys), n):
                parent = _digest(parent + array("q", tokens[i * size : (i + 1) * size]).tobytes())
                keys.append(parent)
        return keys[:n]

    def reuse(self, turn: Turn) -> int:
        """Give a turn that holds no K/V the longest cached run of blocks its tokens
        start with (leaving it at least one token to compute); the positions reused."""
        assert not turn.blocks and turn.computed == 0, "reuse is for a turn without K/V"
        turn.committed = 0
        if not self.enabled:
            return 0
        for key in self.chain(turn, turn.reusable_blocks(self.pool.block_size)):
            block = self.pool.lookup(key)
            if block is None:
                break
            self.pool.acquire(block)
            turn.blocks.append(block)
        turn.committed = len(turn.blocks)
        turn.computed = len(turn.blocks) * self.pool.block_size
        return turn.computed

    def commit(self, turn: Turn) -> None:
        """Register the turn's newly computed full blocks."""
        full = turn.full_blocks(self.pool.block_size)
        if not self.enabled or full <= turn.committed:
            return
        keys = self.chain(turn, full)
        for i in range(turn.committed, full):
            self.pool.register(turn.blocks[i], keys[i])
        turn.committed = full

    # ------------------------------------------------------------------ swap

    def shared_blocks(self, turn: Turn, n: int) -> list[int]:
        """Indices among the turn's first `n` blocks that a swap-out need not copy:
        cached blocks another turn also holds, so they stay on the device anyway."""
        pool = self.pool
        return [i for i, block in enumerate(turn.blocks[:n]) if pool.refs(block) > 1 and pool.is_cached(block)]

    def restore(self, turn: Turn, kept: list[int]) -> list[int] | None:
        """Take back, by their keys, the blocks a swap-out left on the device; None
        (and nothing taken) if one has been evicted since."""
        if not kept:
            return []
        keys = self.chain(turn, max(kept) + 1)
        blocks = [self.pool.lookup(keys[i]) for i in kept]
        if None in blocks:
            return None
        for block in blocks:
            self.pool.acquire(block)
        return blocks
