"""The paged KV pool in device memory, and swapping turns to host memory.

K and V are one buffer each of half-precision floats (kernels/common.cl has
the layout within a block): a block holds every layer's K (or V) for
`block_size` positions of one turn, so moving a block is one contiguous copy,
to host memory and back (a swap) or to another block (the prefix cache's copy).
The scheduler decides which block ids a turn owns; this pool only stores them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyopencl as cl

from gpu.device import Device
from gpu.model.load import ModelConfig
from runtime.errors import ConfigError, EngineError
from runtime.scheduling.units import ceil_div

CPU_KV_CAP = 1 << 30  # bytes; on a CPU device the "device memory" is the host's RAM


KV_BYTES = 2  # f16: half the memory of f32, so twice the paused turns stay resident


def block_bytes(config: ModelConfig, block_size: int) -> int:
    """Bytes of K (or of V) in one block."""
    return config.n_layers * config.n_kv_heads * block_size * config.head_dim * KV_BYTES


def choose_num_blocks(device: Device, config: ModelConfig, block_size: int, kv_fraction: float) -> int:
    """As many blocks as `kv_fraction` of the device memory holds (K and V),
    capped by the largest single allocation and, on a CPU, at 1 GiB."""
    if not 0 < kv_fraction <= 1:
        raise ConfigError(f"kv_fraction must be in (0, 1], got {kv_fraction}")
    budget = kv_fraction * device.global_mem
    if device.is_cpu:
        budget = min(budget, CPU_KV_CAP)
    per_block = block_bytes(config, block_size)
    n = min(int(budget // (2 * per_block)), int(device.device.max_mem_alloc_size // per_block))
    if n < 1:
        raise ConfigError(f"no room for a single KV block of {2 * per_block} bytes on {device.name}")
    return n


class KVPool:
    def __init__(self, device: Device, config: ModelConfig, block_size: int, num_blocks: int):
        if block_size < 1 or num_blocks < 1:
            raise ConfigError(f"block_size and num_blocks must be positive, got {block_size}, {num_blocks}")
        self.device = device
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.block_bytes = block_bytes(config, block_size)
        size = num_blocks * self.block_bytes
        if size > device.device.max_mem_alloc_size:
            raise ConfigError(
                f"{num_blocks} KV blocks need {size} bytes per buffer, over the device's "
                f"largest allocation ({device.device.max_mem_alloc_size}); use fewer blocks"
            )
        flags = cl.mem_flags.READ_WRITE
        self.k = cl.Buffer(device.context, flags, size)
        self.v = cl.Buffer(device.context, flags, size)
        self._swapped: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def check_blocks(self, blocks: Sequence[int], what: str) -> None:
        bad = [b for b in blocks if not 0 <= b < self.num_blocks]
        if bad:
            raise EngineError(f"{what}: block ids {bad[:5]} outside the pool of {self.num_blocks} blocks")

    def swap_out(self, turn: int, blocks: Sequence[int], length: int) -> None:
        """Copy the blocks holding the first `length` positions to host memory."""
        n = ceil_div(length, self.block_size)
        if n > len(blocks):
            raise EngineError(f"turn {turn}: {len(blocks)} blocks cannot hold {length} positions")
        self.check_blocks(blocks[:n], f"swap_out of turn {turn}")
        k = np.empty((n, self.block_bytes), np.uint8)
        v = np.empty((n, self.block_bytes), np.uint8)
        queue = self.device.queue
        for i, block in enumerate(blocks[:n]):
            offset = block * self.block_bytes
            cl.enqueue_copy(queue, k[i], self.k, src_offset=offset, is_blocking=False)
            cl.enqueue_copy(queue, v[i], self.v, src_offset=offset, is_blocking=False)
        queue.finish()
        self._swapped[turn] = (k, v)

    def swap_in(self, turn: int, blocks: Sequence[int]) -> None:
        """Copy a swapped-out turn back into `blocks` and drop the host copy."""
        if turn not in self._swapped:
            raise EngineError(f"turn {turn} has no swapped-out KV to swap in")
        k, v = self._swapped[turn]
        if len(blocks) < len(k):
            raise EngineError(f"turn {turn}: swap_in needs {len(k)} blocks, got {len(blocks)}")
        self.check_blocks(blocks[: len(k)], f"swap_in of turn {turn}")
        queue = self.device.queue
        for i, block in enumerate(blocks[: len(k)]):
            offset = block * self.block_bytes
            cl.enqueue_copy(queue, self.k, k[i], dst_offset=offset, is_blocking=False)
            cl.enqueue_copy(queue, self.v, v[i], dst_offset=offset, is_blocking=False)
        queue.finish()
        del self._swapped[turn]

    def copy(self, source: int, target: int) -> None:
        """Copy block `source`'s K and V into block `target`, device to device.
        Not waited for: the queue is in order, so the next step sees it."""
        self.check_blocks([source, target], "copy")
        if source == target:
            raise EngineError(f"copy of block {source} onto itself")
        queue, n = self.device.queue, self.block_bytes
        for buffer in (self.k, self.v):
            cl.enqueue_copy(queue, buffer, buffer, src_offset=source * n, dst_offset=target * n, byte_count=n)

    def forget(self, turn: int) -> None:
        self._swapped.pop(turn, None)

    def swapped_turns(self) -> set[int]:
        return set(self._swapped)
