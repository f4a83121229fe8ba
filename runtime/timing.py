"""A timing-model engine: the simulator's stand-in for a GPU.

It implements the Engine protocol (no model, no memory: tokens are a constant
that is never end-of-sequence) and prices a step the way a decode-bound GPU does,
a roofline: a step costs the time to read the weights once, `decode_step_s`,
until the batch holds more tokens than the compute can absorb in that time
(`prefill_tok_per_s`), after which it grows with the tokens. KV moves cost bytes
over the host link, and each preemption costs a flush.
"""

from __future__ import annotations

import time
from typing import Sequence

import msgspec

from runtime.engine import Work
from runtime.turns import Plan


class TimingModel(msgspec.Struct, frozen=True, kw_only=True):
    decode_step_s: float = 1 / 39  # one step over any batch within the roofline knee
    prefill_tok_per_s: float = 5000.0  # compute throughput: the knee is decode_step_s * this
    flush_s: float = 0.004  # per preemption: drain and re-launch the batch
    kv_bytes_per_token: int = 131_072  # an 8B-class model in f16
    swap_gb_s: float = 16.0  # host link bandwidth for KV swaps


class TimingEngine:
    def __init__(self, model: TimingModel = TimingModel(), *, block_size: int = 16, num_blocks: int = 1 << 20, token: int = 1, realtime: bool = False) -> None:
        self.model = model
        self.realtime = realtime  # sleep through each step, for runs on a wall clock
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.eos_token_ids: frozenset[int] = frozenset()
        self._token = token

    def step(self, batch: Sequence[Work]) -> list[int | None]:
        if self.realtime:
            time.sleep(max(self.model.decode_step_s, sum(len(w.tokens) for w in batch) / self.model.prefill_tok_per_s))
        return [self._token if work.sample else None for work in batch]

    def swap_out(self, turn: int, blocks: Sequence[int], length: int) -> None:
        pass

    def swap_in(self, turn: int, blocks: Sequence[int]) -> None:
        pass

    def forget(self, turn: int) -> None:
        pass

    # ------------------------------------------------------------- pricing

    def step_s(self, plan: Plan) -> float:
        """Seconds for the plan's steps, KV moves and flushes excluded: its first
        step as given, the rest (the simulator's fast-forward) as one-token decodes."""
        first = max(self.model.decode_step_s, sum(len(w.tokens) for w in plan.works) / self.model.prefill_tok_per_s)
        rest = max(self.model.decode_step_s, len(plan.works) / self.model.prefill_tok_per_s)
        return first + (plan.steps - 1) * rest

    def overhead_s(self, plan: Plan) -> float:
        """Seconds spent before the step can start: flushes and KV moves."""
        moved = sum(length for _, _, length in plan.swap_out)
        moved += sum(len(blocks) * self.block_size for _, blocks in plan.swap_in)
        return plan.preemptions * self.model.flush_s + moved * self.model.kv_bytes_per_token / (self.model.swap_gb_s * 1e9)
