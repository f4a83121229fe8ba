"""An engine whose KV cache really holds something, to prove the scheduler and the
owner keep it intact: for tests that need many thousands of steps, where even the
tiny OpenCL model would be slow.

Its "K/V" at a position is the token there, stored through the turn's block table
in a pool of `num_blocks` blocks; swaps copy blocks to and from a host dict exactly
as gpu/kvcache.KVPool does (a swap-in without a host copy raises). A step first
checks every position before the work's start reads back what the turn really
holds, then writes its tokens, then samples a token that is a hash of the whole
sequence *as read from the cache*: so a lost, stale or mixed-up block changes the
output, and greedy outputs under memory pressure equal those without it.

With `eos_every` it samples end-of-sequence now and then (a hash of the
sequence decides), so turns end mid-batch. With `window` the token is a hash
of the last `window` tokens only (read from the cache all the same), so
sequences repeat and prompt lookup's drafts (runtime.scheduling.drafts) are
often right. A work verifying drafts gets a token per row, each from the
sequence up to that row.

Faults can be injected: `fail_next(kind, turn)` makes the next swap_out, swap_in or
step touching that turn (any turn, for None) raise.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import numpy as np

from runtime.errors import SlotswarmError
from runtime.scheduling.timing import TimingModel
from runtime.scheduling.work import Work

VOCAB = 64
EOS = 2


class InjectedFault(SlotswarmError):
    pass


def next_token(sequence: Sequence[int], vocab: int = VOCAB, eos_every: int | None = None, window: int | None = None) -> int:
    h = 1469598103934665603
    for t in sequence[-window:] if window else sequence:
        h = ((h ^ int(t)) * 1099511628211) & 0xFFFF_FFFF_FFFF_FFFF
    if eos_every and (h >> 32) % eos_every == 0:
        return EOS  # about one sequence in `eos_every` ends here
    return 3 + h % (vocab - 3)  # never eos, never a control token


class KVEngine:
    def __init__(
        self,
        *,
        num_blocks: int = 40,
        block_size: int = 4,
        vocab: int = VOCAB,
        eos: bool = False,
        eos_every: int | None = None,
        window: int | None = None,
    ) -> None:
        self.window = window
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.vocab_size = vocab
        self.eos_every = eos_every  # sample end-of-sequence about once in this many tokens
        self.eos_token_ids = frozenset({EOS} if eos or eos_every else ())
        self.tokenizer = None
        self.constraints = None
        self.blocking = True  # a stand-in for a device: its steps run in the owner's step thread
        self.max_batch_tokens = self.max_context = None
        self.device_name, self.model_name, self.model_id = "kv test engine", None, "kv test engine"
        self.cost = TimingModel.cpu().cost()  # a CPU's law, so step shaping thins the batch here too
        self.cache = np.full((num_blocks, block_size), -1, np.int64)
        self.host: dict[int, np.ndarray] = {}
        self.faults: list[tuple[str, int | None, str]] = []
        self.failed: list[tuple[str, int]] = []  # faults that fired
        self.done: collections.Counter[str] = collections.Counter()  # swaps that succeeded
        self.steps = 0

    def fail_next(self, kind: str, turn: int | None = None, why: str = "injected fault", times: int = 1) -> None:
        self.faults += [(kind, turn, why)] * times

    def _fault(self, kind: str, turn: int) -> None:
        for fault in self.faults:
            if fault[0] == kind and fault[1] in (None, turn):
                self.faults.remove(fault)
                self.failed.append((kind, turn))
                raise InjectedFault(f"{kind} of turn {turn}: {fault[2]}")

    def _read(self, table: Sequence[int], n: int) -> list[int]:
        bs = self.block_size
        return [int(self.cache[table[p // bs], p % bs]) for p in range(n)]

    def step(self, batch: Sequence[Work], abandon: object = None) -> list[int | list[int] | None]:
        for w in batch:
            self._fault("step", w.turn)
        out = []
        for w in batch:
            if any(not 0 <= t < self.vocab_size for t in w.tokens):
                raise ValueError(f"turn {w.turn}: token outside the vocabulary")
            before = self._read(w.block_table, w.start)
            if -1 in before:
                raise AssertionError(f"turn {w.turn}: positions before {w.start} were never written (lost KV)")
            bs = self.block_size
            for i, t in enumerate(w.tokens):
                p = w.start + i
                self.cache[w.block_table[p // bs], p % bs] = t
            seen = self._read(w.block_table, w.start + len(w.tokens))
            rows = [next_token(seen[: len(seen) - d], self.vocab_size, self.eos_every, self.window) for d in range(w.drafts, -1, -1)]
            out.append((rows if w.drafts else rows[0]) if w.sample else None)
        self.steps += 1
        return out

    def swap_out(self, turn: int, blocks: Sequence[int], length: int) -> None:
        self._fault("swap_out", turn)
        n = -(-length // self.block_size)
        self.host[turn] = self.cache[list(blocks[:n])].copy()
        self.done["swap_out"] += 1

    def swap_in(self, turn: int, blocks: Sequence[int]) -> None:
        self._fault("swap_in", turn)
        if turn not in self.host:
            raise ValueError(f"turn {turn} has no swapped-out KV to swap in")
        copy = self.host.pop(turn)
        self.cache[list(blocks[: len(copy)])] = copy
        self.done["swap_in"] += 1

    def forget(self, turn: int) -> None:
        self.host.pop(turn, None)

    def copy(self, source: int, target: int) -> None:
        self._fault("copy", -1)
        self.cache[target] = self.cache[source]
        self.done["copy"] += 1

    def calibrate(self) -> None:
        pass


def reference_output(
    prompt: Sequence[int],
    max_tokens: int,
    vocab: int = VOCAB,
    *,
    eos_every: int | None = None,
    ignore_eos: bool = True,
    window: int | None = None,
) -> list[int]:
    """What a turn alone, never paused, generates (greedy; with `eos_every`, up to
    and with its end-of-sequence unless it ignores it)."""
    seq, out = list(prompt), []
    for _ in range(max_tokens):
        out.append(next_token(seq, vocab, eos_every, window))
        seq.append(out[-1])
        if out[-1] == EOS and not ignore_eos:
            break
    return out
