"""A timing-model engine: the simulator's stand-in for a GPU.

It implements the Engine protocol (no model, no memory: tokens are a constant
that is never end-of-sequence) and prices a step by the same law as the real
engine's cost model (runtime.scheduling.cost), with exact coefficients:

    step_s = decode_step_s + (tokens - 1) / prefill_tok_per_s + kv_read_s * kv_reads

so one turn's decode costs `decode_step_s`, each further token in the step (a
batch-mate's decode, a prefill token, a draft verified) costs compute time, and
attention costs the KV positions it reads. The defaults are a GPU in its memory-bound regime, where a
batch of eight costs a few percent more than one turn; a CPU profile is `cpu()`.
KV moves cost bytes over the host link, a block copy (the prefix cache's)
bytes of device bandwidth, and each preemption costs a flush.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import msgspec

from runtime.scheduling.cost import StepCost
from runtime.scheduling.turns import Plan
from runtime.scheduling.work import Work


class TimingModel(msgspec.Struct, frozen=True, kw_only=True):
    decode_step_s: float = 1 / 39  # one turn's decode step (reading the weights once)
    prefill_tok_per_s: float = 5000.0  # compute throughput: each further token in a step
    kv_read_s: float = 4e-8  # per KV position attention reads (128 KiB at ~3 TB/s)
    flush_s: float = 0.004  # per preemption: drain and re-launch the batch
    kv_bytes_per_token: int = 131_072  # an 8B-class model in f16
    swap_gb_s: float = 16.0  # host link bandwidth for KV swaps
    copy_gb_s: float = 1500.0  # device memory bandwidth for a block copy (bytes read + written)

    def cost(self) -> StepCost:
        token_s = 1 / self.prefill_tok_per_s
        return StepCost(self.decode_step_s - token_s, token_s, self.kv_read_s, learns=False)

    @classmethod
    def cpu(cls) -> TimingModel:
        """SmolLM2-135M on the 2-core CPU through PoCL: a step of eight decodes
        costs about three of one, so batching is far from free."""
        return cls(decode_step_s=0.010, prefill_tok_per_s=400.0, kv_read_s=2e-8, copy_gb_s=30.0)


DEFAULT_TIMING = TimingModel()


class TimingEngine:
    def __init__(
        self,
        model: TimingModel = DEFAULT_TIMING,
        *,
        block_size: int = 16,
        num_blocks: int = 1 << 20,
        token: int = 1,
        realtime: bool = False,
    ) -> None:
        self.model = model
        self.realtime = realtime  # sleep through each step, for runs on a wall clock
        self.blocking = realtime  # (else a step returns at once: the owner calls it inline)
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.eos_token_ids: frozenset[int] = frozenset()
        self.tokenizer = None  # prompts are token ids
        self.constraints = None  # (no vocabulary to hold a turn to)
        self.max_batch_tokens: int | None = None
        self.max_context: int | None = None
        self.vocab_size: int | None = None
        self.device_name = "timing model"
        self.model_name: str | None = None
        self.cost = model.cost()  # exact: there is nothing to learn
        self._law = model.cost()  # what steps really cost, whatever `cost` is told
        self.model_id = "timing model"
        self._token = token

    def calibrate(self) -> None:
        pass

    def step(self, batch: Sequence[Work], abandon: threading.Event | None = None) -> list[int | list[int] | None] | None:
        if self.realtime:
            seconds = self._law.predict_works(batch)
            if abandon is None:
                time.sleep(seconds)
            elif abandon.wait(seconds):
                return None
        # (a work verifying drafts gets its token at every row: its drafts are kept
        # where they are the token, runtime.scheduling.drafts)
        return [([self._token] * (work.drafts + 1) if work.drafts else self._token) if work.sample else None for work in batch]

    def swap_out(self, turn: int, blocks: Sequence[int], length: int) -> None:
        pass

    def swap_in(self, turn: int, blocks: Sequence[int]) -> None:
        pass

    def forget(self, turn: int) -> None:
        pass

    def copy(self, source: int, target: int) -> None:
        pass

    # ------------------------------------------------------------- pricing

    def step_s(self, plan: Plan, steps: int = 1) -> float:
        """Seconds for `steps` steps of the plan, KV moves and flushes excluded: its
        first step as given, the rest (the simulator's fast-forward, Scheduler.repeatable)
        as one-token decodes whose attention reads one more position per item each step."""
        return self.steps_s(*self.first_and_next_s(plan), len(plan.works), steps)

    def first_and_next_s(self, plan: Plan) -> tuple[float, float]:
        """`first_step_s` and `next_step_s` of the plan, its works read once (the
        simulator prices every round's plan)."""
        tokens = kv = ends = 0
        for work in plan.works:  # (step_features and next_step_s's sum, in one pass)
            n, start = len(work.tokens), work.start
            tokens += n
            kv += n * start + n * (n + 1) // 2
            ends += start + n
        items = len(plan.works)
        return self._law.predict(tokens, kv), self._law.predict(items, ends + items)

    def steps_s(self, first_s: float, next_s: float, items: int, steps: int) -> float:
        """`step_s` from a plan's `first_step_s`, `next_step_s` and number of items,
        priced once for the many step counts the simulator tries."""
        rest = steps - 1
        # Fast-forwarded step k (1 .. rest) reads k - 1 more positions per item than the first of them.
        growth = self._law.kv_s * items * (rest * (rest - 1) // 2)
        return first_s + rest * next_s + growth

    def first_step_s(self, plan: Plan) -> float:
        return self._law.predict(*plan.features)

    def next_step_s(self, plan: Plan) -> float:
        """The first fast-forwarded step: one decode per item, just past the first step."""
        ends = sum([w.start + len(w.tokens) for w in plan.works])
        return self._law.predict(len(plan.works), ends + len(plan.works))

    def overhead_s(self, plan: Plan) -> float:
        """Seconds spent before the step can start: flushes and KV moves."""
        if not plan.moves and not plan.preemptions:
            return 0.0  # (most steps)
        moved = sum(length for _, _, length in plan.swap_out)
        moved += sum(len(blocks) * self.block_size for _, blocks in plan.swap_in)
        copied = 2 * len(plan.copies) * self.block_size  # read and written once each
        per_token = self.model.kv_bytes_per_token
        return (
            plan.preemptions * self.model.flush_s
            + moved * per_token / (self.model.swap_gb_s * 1e9)
            + copied * per_token / (self.model.copy_gb_s * 1e9)
        )
