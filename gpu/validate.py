"""What an engine step accepts: a batch checked against the model and the KV pool.

A step is given by the scheduler, but the engine is a public object too: a
batch that would read past the context, outside the vocabulary or through a
block it does not own is refused with an EngineError naming the turn, before
anything reaches the device.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpu.kvcache import KVPool
from gpu.model.arch import ModelConfig
from runtime.errors import EngineError
from runtime.scheduling.units import ceil_div
from runtime.scheduling.work import Work


def check_batch(batch: Sequence[Work], cfg: ModelConfig, block_size: int, kv: KVPool) -> None:
    if not batch:
        raise EngineError("an engine step needs at least one Work item")
    turns = [w.turn for w in batch]
    if len(set(turns)) != len(turns):
        raise EngineError(f"a step may hold at most one Work per turn, got turns {turns}")
    vocab, ctx = cfg.vocab_size, cfg.context_length
    for w in batch:
        if not w.tokens:
            raise EngineError(f"turn {w.turn}: Work with no tokens")
        if w.start < 0:
            raise EngineError(f"turn {w.turn}: negative start {w.start}")
        if w.drafts and not (0 < w.drafts < len(w.tokens) and w.sample and w.constraint is None):
            raise EngineError(f"turn {w.turn}: {w.drafts} drafts need more tokens than drafts, `sample`, and no constraint")
        end = w.start + len(w.tokens)
        if end > ctx:
            raise EngineError(f"turn {w.turn}: positions up to {end} exceed the context length {ctx}")
        if min(w.tokens) < 0 or max(w.tokens) >= vocab:
            raise EngineError(f"turn {w.turn}: token ids must be in [0, {vocab})")
        need = ceil_div(end, block_size)
        if len(w.block_table) < need:
            raise EngineError(
                f"turn {w.turn}: block table of {len(w.block_table)} blocks covers "
                f"{len(w.block_table) * block_size} positions, the work reaches position {end - 1}"
            )
        kv.check_blocks(w.block_table[:need], f"turn {w.turn}")
