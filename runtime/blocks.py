"""KV block accounting: which of the engine's pool blocks are free.

The scheduler owns this object; the engine owns the memory behind the ids. A turn
holds the blocks covering every position whose K/V has been computed, in order
(its block table). Blocks are conserved: free + held by turns == num_blocks.
"""

from __future__ import annotations

from collections import deque

from runtime.errors import UsageError


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise UsageError(f"need at least one block of at least one position, got {num_blocks} x {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def blocks_for(self, positions: int) -> int:
        """Blocks needed to hold `positions` token positions."""
        return -(-positions // self.block_size)

    def grow(self, table: list[int], positions: int) -> bool:
        """Extend a block table to cover `positions`; False (and no change) if the
        pool is short."""
        missing = self.blocks_for(positions) - len(table)
        if missing <= 0:
            return True
        if missing > len(self._free):
            return False
        table.extend(self._free.popleft() for _ in range(missing))
        return True

    def release(self, table: list[int]) -> None:
        self._free.extend(table)
        table.clear()
