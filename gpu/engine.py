"""The OpenCL decode engine: the forward pass gpu/model/arch.py describes, over a paged KV pool.

One `step` runs any mix of prefill chunks and decodes, for any subset of turns
at any positions, as ONE flat batch of tokens: every weight is read once per
step whatever the batch holds. Per layer (x is the residual stream, [T, d]):

    xn  = rmsnorm(x) * attn_norm
    qkv = xn @ [Wq | Wk | Wv]^T                    one matmul for all three
    q, k = rope(q, k); K/V cache[pos] = k, v       f16, through each turn's block table
    x  += attention(q, K, V) @ Wo^T                causal, grouped-query
    xn  = rmsnorm(x) * ffn_norm
    h   = silu(xn @ Wgate^T) * (xn @ Wup^T)        one fused kernel
    x  += h @ Wdown^T

then, only for the items that sample, logits = rmsnorm(x_last) @ Wout^T, and
for greedy items the argmax, on the device.

The architecture's switches add to that: QKV biases and NEOX RoPE cost nothing
(the bias is added where RoPE is; NEOX models' Q/K rows are permuted on upload
so one RoPE serves all), per-head Q/K norms are one more launch, GELU and the
embedding scale are compile-time constants, a sliding window is each layer's
attention argument, and post-norms make each residual add a launch of its own
(a norm needs its whole input before it can add it).

The kernels come in two families shaped for a CPU or a GPU (gpu/families.py),
chosen per device or forced with `kernels=`; both fuse the norms, RoPE, the K/V
store, SwiGLU and the residual adds into the matmuls. Every launch is bound to
its buffers once at start-up and a step is enqueued without a host sync; what a
step reads back is the sampled token ids, the items that sample at a
temperature drawn on the device too, or their top-p candidates
(gpu/devicesampling.py).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyopencl as cl

from gpu.device import Device, select_device
from gpu.devicesampling import CAP, HEADER, plan_rows, read_back
from gpu.families import GPUFamily, GPUTuning, family_weights, make_family
from gpu.grammar import ConstraintCompiler
from gpu.inputs import StepInputs
from gpu.kvcache import KVPool, choose_num_blocks
from gpu.masks import MaskTimes, TurnMasks
from gpu.model.fetch import resolve_model
from gpu.model.load import Model, load_model
from gpu.model.tokenizer import Tokenizer
from gpu.validate import check_batch
from runtime.errors import ConfigError, DeviceError, UnsupportedModelError
from runtime.scheduling.cost import StepCost
from runtime.scheduling.units import ceil_div
from runtime.scheduling.work import CHECK_POINTS, DeadEnd, Work, sampled_rows

# On a device that computes on the host's own cores (PoCL), its workers keep the
# enqueuing thread off the CPU while it holds the GIL: enqueuing a whole step at
# once leaves the event loop waiting for most of the step. So there a step is
# enqueued in groups, the thread waiting (without the GIL) at each of
# runtime.scheduling.work's CHECK_POINTS for the launches before the previous point:
# the loop runs during the waits, and the device always has a group queued.
# (A sleep(0) every few launches instead lets the loop hold the GIL while the
# device runs dry, and each sleep's timer slack takes a core from PoCL's
# workers when it wakes.) The readback waits for
# the step in `finish`, which lets go of the GIL: PoCL's "non-blocking" read blocks
# until the queue drains, and pyopencl holds the GIL through it, which froze the
# event loop for the rest of every step.

i32 = np.int32
RW = cl.mem_flags.READ_WRITE
GPU_MAX_SPLITS = GPUFamily.MAX_SPLITS


def say_on_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def open_engine(model: str | Path | Model | None = None, device: str | Device | None = None, **options) -> OpenCLEngine:
    """The engine for a model file (None: the default model, fetched once) on a
    device (None: the first usable one). What run, bench and generate all use;
    `options` are OpenCLEngine's (block_size, num_blocks, ...)."""
    if not isinstance(model, Model):
        model = resolve_model(model)
    return OpenCLEngine(model, device=device, **options)


class OpenCLEngine:
    """Implements `runtime.scheduling.work.Engine` on an OpenCL device.

    kernels: "auto" (the family shaped for the device), "cpu" or "gpu".
    profile: time every launch with OpenCL profiling events (`last_profile`).
    gpu_tuning: the GPU kernels' attention span and lane sums (tests force them).
    on_compile: told, in one line, when the kernels are not in the binary cache and
    compile now (the long silence of a first run); None to say nothing.
    """

    def __init__(
        self,
        model: str | Model,
        *,
        device: str | Device | None = None,
        kernels: str | None = None,
        block_size: int = 16,
        num_blocks: int | None = None,
        kv_fraction: float = 0.25,
        max_batch_tokens: int = 256,
        profile: bool = False,
        gpu_tuning: GPUTuning | None = None,
        on_compile: Callable[[str], None] | None = say_on_stderr,
    ):
        self.model = model if isinstance(model, Model) else load_model(model)
        self.model_id = f"{self.model.path.name}:{self.model.path.stat().st_size}"
        cfg = self.config = self.model.config
        if block_size % 16:
            raise ConfigError(f"block_size must be a multiple of 16 (the attention kernel's width), got {block_size}")
        if cfg.head_dim % 16 or cfg.d_model % 32 or cfg.d_ff % 32 or cfg.n_heads % cfg.n_kv_heads:
            raise UnsupportedModelError(
                f"{self.model.path}: the kernels need head_dim % 16 == 0, d_model and d_ff % 32 == 0 "
                f"and n_heads a multiple of n_kv_heads (got {cfg})"
            )
        device = device if isinstance(device, Device) else select_device(device)
        if profile:
            props = cl.command_queue_properties.PROFILING_ENABLE
            device = dataclasses.replace(device, queue=cl.CommandQueue(device.context, device.device, properties=props))
        self.device = device
        self.device_name = device.name
        self.model_name = Path(self.model.path).name
        self.max_context = cfg.context_length
        self.family = make_family(kernels, device, gpu_tuning)
        self.family.check(self)
        self.profile = profile
        self.on_compile, self._compiling_said = on_compile, False
        self.blocking = True  # a step waits for the device
        self.last_profile: list[tuple[str, int, cl.Event]] = []  # (name, weight bytes, event) of the last step
        self.whole_rows_read = 0  # top-p rows whose candidates fell short: read back whole (gpu.devicesampling)
        self.block_size = block_size
        self.num_blocks = num_blocks or choose_num_blocks(self.device, cfg, block_size, kv_fraction)
        self.max_batch_tokens = max_batch_tokens
        self.max_blocks = ceil_div(cfg.context_length, block_size)  # block table width
        self.step_positions = 0  # the most positions a token of the step attends to
        self.kv = KVPool(self.device, cfg, block_size, self.num_blocks)
        self.weights = family_weights(self.family, self.device, self.model)
        self._allocate(max_batch_tokens)
        self.program = self._build()  # (also the bench's: swarm/bench/engine.py's multiply_ceiling)
        self.launches = self.family.bind(self, self.program)
        self.cost = StepCost()  # a placeholder until `calibrate` measures this device
        self.calibrated = False
        self.mask_times = MaskTimes()  # what constrained rows' masks cost the host, and what the overlap hid

    @property
    def kernels(self) -> str:
        """The kernel family in use: "cpu" or "gpu"."""
        return self.family.name

    # ------------------------------------------------------------------ setup

    def _build(self) -> cl.Program:
        cfg = self.config
        options = [
            f"-DEMBED_SCALE={float(np.sqrt(cfg.d_model)) if cfg.arch.embed_scale else 1.0!r}f",
            f"-DQK_NORM={int(cfg.arch.qk_norm)}",
            f"-DACT_GELU={int(cfg.arch.activation == 'gelu')}",
            f"-DNORM_EPS={cfg.norm_eps!r}f",
            f"-DHEAD_DIM={cfg.head_dim}",
            f"-DN_HEADS={cfg.n_heads}",
            f"-DN_KV_HEADS={cfg.n_kv_heads}",
            f"-DN_LAYERS={cfg.n_layers}",
            f"-DBLOCK_SIZE={self.block_size}",
            f"-DROPE_TABLE={self.weights.rope_positions}",
        ]
        while True:  # the GPU family may halve its work-groups, or give up subgroups, and build again
            try:
                program = self.device.build(self.family.source(), options + self.family.options(self), on_compile=self._say_compiling)
            except DeviceError:
                if self.family.name == "gpu" and self.family.fall_back():
                    continue
                raise
            if self.family.name == "cpu" or self.family.fit(program, self.device):
                return program

    def _say_compiling(self) -> None:
        if self.on_compile is not None and not self._compiling_said:
            self._compiling_said = True
            self.on_compile(
                f"compiling the {self.family.name} kernels for {self.model_name} on {self.device_name.strip()}: "
                f"the first run of a model on a device takes a while; later runs take them from the cache"
            )

    def _allocate(self, t: int) -> None:
        """Buffers for a step of up to `t` tokens, made once."""
        cfg, ctx = self.config, self.device.context
        f = lambda n: cl.Buffer(ctx, RW, 4 * n)  # noqa: E731
        const = lambda a: cl.Buffer(ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=a)  # noqa: E731
        qkv_dim = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
        ones = np.ones(max(cfg.d_model, cfg.d_ff, cfg.n_heads * cfg.head_dim), np.float32)
        self.inputs = StepInputs(self.device, t, self.max_blocks)
        self.buffers = SimpleNamespace(
            x=f(t * cfg.d_model),
            qkv=f(t * qkv_dim),
            att=f(t * cfg.n_heads * cfg.head_dim),  # attention output
            # attention splits' partial results, and a done-counter per (token, KV head) (gpu family)
            split_scratch=f(t * cfg.n_kv_heads * GPU_MAX_SPLITS * (cfg.n_heads // cfg.n_kv_heads) * (cfg.head_dim + 2)),
            split_counters=cl.Buffer(ctx, RW | cl.mem_flags.COPY_HOST_PTR, hostbuf=np.zeros(t * cfg.n_kv_heads, i32)),
            h=f(t * cfg.d_ff),
            **self.inputs.regions, ids=f(t),
            all_rows=const(np.arange(t, dtype=i32)),
            tmp=f(t * cfg.d_model),  # a sublayer's output before its post-norm
            ones=const(ones),
            logits=f(t * cfg.vocab_size),
            found=f(t * (HEADER + 2 * CAP)),  # top-p rows' candidates (gpu.devicesampling)
            masks=cl.Buffer(ctx, RW, 4 * t * ceil_div(cfg.vocab_size, 32)),  # constrained rows' token masks (gpu.masks)
        )  # fmt: skip

    # --------------------------------------------------------------- protocol

    @functools.cached_property
    def tokenizer(self) -> Tokenizer:
        return Tokenizer.from_model(self.model)

    @functools.cached_property
    def constraints(self) -> ConstraintCompiler:
        return ConstraintCompiler(self.tokenizer, self.config.vocab_size)

    @functools.cached_property
    def masks(self) -> TurnMasks:
        """Each constrained turn's place in its constraint (gpu.masks)."""
        return TurnMasks(self.constraints)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @functools.cached_property
    def eos_token_ids(self) -> frozenset[int]:
        return frozenset(self.tokenizer.eos_ids)

    def calibrate(self) -> None:
        """Seed the step cost law from a few timed steps (gpu.calibrate), once."""
        if self.calibrated:
            return
        from gpu.calibrate import calibration_samples

        self.cost.calibrate(calibration_samples(self))
        self.calibrated = True

    def step(self, batch: Sequence[Work], abandon: threading.Event | None = None) -> list[int | list[int] | None] | None:
        check_batch(batch, self.config, self.block_size, self.kv)
        rows = [w for w in batch for _ in range(sampled_rows(w))]  # (a work verifying drafts samples several)
        masks = self._plan_masks(rows)
        began = self.masks.begin_step() if "masks" in self.__dict__ else None
        try:
            ran = self._run(batch, np.zeros(len(rows), dtype=bool), abandon, [w.sampling for w in rows], masks)
        finally:
            if began is not None:
                self.masks.end_step(began)
        if ran is None:
            return None
        tokens = ran[0].tolist()
        out: list[int | list[int] | None] = []
        at = 0
        for w in batch:
            n = sampled_rows(w)
            out.append(None if not n else tokens[at : at + n] if w.drafts else tokens[at])
            at += n
        if masks is not None and masks.dead:
            raise DeadEnd([None if w.turn in masks.dead else t for w, t in zip(batch, out, strict=False)], masks.dead)
        return out

    def _plan_masks(self, sampled: Sequence[Work]) -> _StepMasks | None:
        """The constrained rows (`sampled`: each sampled row's work), whose masks
        `_forward` computes while the device runs the step's layers; None if no
        row is constrained (nothing is done)."""
        at = [i for i, w in enumerate(sampled) if w.constraint is not None]
        if not at:
            return None
        return _StepMasks(self.masks, [sampled[i] for i in at], at, self.mask_times)

    def swap_out(self, turn: int, blocks: Sequence[int], length: int) -> None:
        self.kv.swap_out(turn, blocks, length)

    def swap_in(self, turn: int, blocks: Sequence[int]) -> None:
        self.kv.swap_in(turn, blocks)

    def forget(self, turn: int) -> None:
        self.kv.forget(turn)
        if "masks" in self.__dict__:
            self.masks.forget(turn)

    def copy(self, source: int, target: int) -> None:
        self.kv.copy(source, target)

    # ------------------------------------------------------------------ steps

    def step_logits(self, batch: Sequence[Work]) -> np.ndarray:
        """Run a step; the logits (n_sampled, vocab) at the last position of each
        item with `sample` set (its last drafts + 1 positions where it verifies
        drafts), in batch order. Writes K/V like `step`."""
        check_batch(batch, self.config, self.block_size, self.kv)
        n = sum(sampled_rows(w) for w in batch)
        return self._run(batch, np.ones(n, dtype=bool))[1]

    def _run(
        self,
        batch: Sequence[Work],
        want_logits: np.ndarray,
        abandon: threading.Event | None = None,
        samplings: Sequence | None = None,
        masks: _StepMasks | None = None,
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """Enqueue the step; (the token ids of the sampled rows, the logits of the
        sampled rows where want_logits is set), or None if `abandon` was set
        before it was all enqueued. An item with `sample` samples its last row,
        or its last drafts + 1 rows. Without `samplings` (the sampled rows')
        every sampled row's id is its argmax. `masks` constrain some sampled rows."""
        tokens = np.array([t for w in batch for t in w.tokens], dtype=i32)
        pos = np.concatenate([np.arange(w.start, w.start + len(w.tokens), dtype=i32) for w in batch])
        seq = np.repeat(np.arange(len(batch), dtype=i32), [len(w.tokens) for w in batch])
        tables = np.zeros((len(batch), self.max_blocks), dtype=i32)
        for s, w in enumerate(batch):
            need = ceil_div(w.start + len(w.tokens), self.block_size)
            tables[s, :need] = w.block_table[:need]
        ends = np.cumsum([len(w.tokens) for w in batch]) - 1
        sampling = [(e, w) for e, w in zip(ends.tolist(), batch, strict=False) if w.sample]
        # (a row's token is sampled for the position after it)
        sample_at = np.array([r for e, w in sampling for r in range(e - w.drafts, e + 1)], dtype=i32)
        ends_at = [(w.start + len(w.tokens), w.drafts) for _, w in sampling]
        positions = np.array([p for end, drafts in ends_at for p in range(end - drafts, end + 1)], dtype=np.int64)
        samplings = list(samplings) if samplings is not None else []

        # A step longer than the buffers runs as consecutive sub-steps; that is
        # exact, since a later sub-step sees the K/V the earlier ones stored.
        self.last_profile = []
        ids, logits = [], []
        m = self.max_batch_tokens
        for c0 in range(0, len(tokens), m):
            c1 = min(c0 + m, len(tokens))
            here = (sample_at >= c0) & (sample_at < c1)
            turns, local_seq = np.unique(seq[c0:c1], return_inverse=True)
            chosen = np.flatnonzero(here)
            got = self._forward(
                tokens[c0:c1],
                pos[c0:c1],
                local_seq.astype(i32),
                tables[turns],
                (sample_at[here] - c0).astype(i32),
                want_logits[here],
                abandon,
                [samplings[i] for i in chosen] if samplings else [],
                positions[chosen].tolist(),
                masks.part(chosen) if masks is not None else None,
            )
            if got is None:
                return None
            ids.append(got[0])
            logits.append(got[1])
        vocab = self.config.vocab_size
        return np.concatenate(ids), np.concatenate(logits) if logits else np.zeros((0, vocab), np.float32)

    def _forward(
        self, tokens, pos, seq, tables, sample_rows, want_logits, abandon=None, samplings=(), positions=(), masks=None
    ) -> tuple[np.ndarray, np.ndarray] | None:
        q, b, step = self.device.queue, self.buffers, self.launches
        t, n, vocab = len(tokens), len(sample_rows), self.config.vocab_size
        self.step_positions = int(pos.max()) + 1
        hot, params = plan_rows(samplings, positions)
        masked = masks if masks is not None and len(masks.rows) else None
        rows = masked.rows if masked is not None else np.zeros(0, i32)
        self.inputs.write(
            q, tokens=tokens, pos=pos, seq=seq, sample_rows=sample_rows, hot_rows=hot, hot_params=params, mask_rows=rows, tables=tables
        )  # finished below
        # The last layer's launches past its K/V feed only the head: a step (a prompt's
        # chunk) that samples no row stops at the K/V. A one-token step that samples takes
        # the layers a launch each where the family has them (the same bits).
        if t == 1 and n and step.one_token:
            layers = step.one_token
        else:
            layers = step.layers if n else step.layers[: step.kv_only]
        launches = [(step.embed, t)] + [(launch, t) for launch in layers]
        if n:
            launches += [(launch, n) for launch in step.head]
        if masked is not None:
            # Only this launch waits for the host's masks, computed while the
            # layers above run (gpu.masks): their copy goes just before it.
            launches.append((_MaskLaunch(step.mask, b.masks, masked), len(rows)))
        mask_at = len(launches) - 1
        if not want_logits.all():
            launches.append((step.argmax, n))
        if len(hot):
            launches.append((step.sample, len(hot)))  # after argmax: these rows' ids are its
        # In groups on a host CPU (see CHECK_POINTS above), and wherever the step
        # may be abandoned: then, at each point, stop enqueuing if the flag is set.
        # What was enqueued finishes; the K/V it wrote is rewritten when the batch
        # runs again.
        grouped, every = abandon is not None or self.device.is_cpu, -(-len(launches) // CHECK_POINTS)
        # The masks are computed while the device has work queued to run meanwhile:
        # grouped, a share at each check point from the third on (two groups
        # queued: the waits give it no more), so the queue never runs dry for
        # long; else once the layers are all enqueued, just before their launch.
        fill_at = 2 * every if grouped else mask_at
        if masked is not None and grouped:
            share = -(-len(masked.picks) // max(1, len(range(fill_at, mask_at + 1, every))))
        checked: cl.Event | None = None
        event = None
        for i, (launch, size) in enumerate(launches):
            if grouped and i % every == 0:
                marker = cl.enqueue_marker(q)
                if masked is not None and fill_at <= i <= mask_at:
                    masked.fill(marker, share)
                if checked is not None:
                    checked.wait()  # (lets go of the GIL)
                checked = marker
                if abandon is not None and abandon.is_set():
                    q.finish()
                    return None
            if masked is not None and not grouped and i == fill_at:
                masked.fill(event)
            enqueued = launch.enqueue(q, size)
            if enqueued is None:
                continue
            event = enqueued
            if self.profile:
                self.last_profile.append((launch.name, launch.weight_bytes, event))
        if self.device.is_cpu:
            q.finish()  # see CHECK_POINTS above
        ids = np.zeros(n, i32)
        logits = np.empty((int(want_logits.sum()), vocab), np.float32)
        if want_logits.all():
            if n:
                cl.enqueue_copy(q, logits, b.logits, is_blocking=False)
        else:
            for j, i in enumerate(np.flatnonzero(want_logits)):
                cl.enqueue_copy(q, logits[j], b.logits, src_offset=4 * int(i) * vocab, is_blocking=False)
            cl.enqueue_copy(q, ids, b.ids, is_blocking=False)
        self.whole_rows_read += read_back(q, b, ids, hot, params, samplings, positions, vocab)  # (finishes the queue)
        return ids, logits


class _StepMasks:
    """A step's constrained rows (by index among its sampled items) and their masks."""

    def __init__(self, masks: TurnMasks, works: list[Work], at: list[int], times: MaskTimes) -> None:
        self.masks, self.works, self.at, self.times = masks, works, at, times
        self.out = np.empty((len(works), masks.words), np.int32)
        self.dead: dict[int, str] = {}
        self.filled = 0  # rows whose masks are computed, from the first

    def part(self, chosen: np.ndarray) -> _RowMasks:
        """Those of one sub-step (`chosen`: its sampled items, by index)."""
        where = {i: k for k, i in enumerate(self.at)}
        mine = [(j, where[int(i)]) for j, i in enumerate(chosen) if int(i) in where]
        return _RowMasks(self, np.array([j for j, _ in mine], dtype=i32), [k for _, k in mine])

    def fill(self, busy: cl.Event | None, rows: int | None = None) -> None:
        """Compute the next `rows` masks (None: the rest), while the device runs
        what was enqueued up to `busy`. If the device got there first, it waited
        for them (their time counts as not hidden). A dead end's row is left
        unmasked: its token is thrown away, and a row of nothing but -inf would
        sample nonsense."""
        a = self.filled
        b = len(self.works) if rows is None else min(len(self.works), a + rows)
        if a >= b:
            return
        started, cpu = time.perf_counter(), time.thread_time()
        dead = self.masks.fill(self.works[a:b], self.out[a:b])
        spent = time.perf_counter() - started
        idle = busy is None or busy.command_execution_status == cl.command_execution_status.COMPLETE
        self.times.note(b - a, spent, time.thread_time() - cpu, spent if idle else 0.0, first=a == 0)
        for k in range(a, b):
            if self.works[k].turn in dead:
                self.out[k] = -1
        self.dead.update(dead)
        self.filled = b


class _RowMasks:
    """One sub-step's constrained rows (`rows`: their places among its sampled rows)."""

    def __init__(self, step: _StepMasks, rows: np.ndarray, picks: list[int]) -> None:
        self.step, self.rows, self.picks = step, rows, picks

    def fill(self, busy: cl.Event | None, rows: int | None = None) -> None:
        self.step.fill(busy, rows)

    def get(self) -> np.ndarray:
        self.step.fill(None)
        return self.step.out[self.picks]


class _MaskLaunch:
    """The step's one launch that needs the host's masks: copy them in, apply them."""

    name, weight_bytes = "mask", 0

    def __init__(self, apply, buffer: cl.Buffer, masks: _RowMasks) -> None:
        self.apply, self.buffer, self.masks = apply, buffer, masks

    def enqueue(self, queue: cl.CommandQueue, rows: int) -> cl.Event:
        self.host = np.ascontiguousarray(self.masks.get())  # (kept until the queue has read it: the step finishes it)
        cl.enqueue_copy(queue, self.buffer, self.host, is_blocking=False)
        return self.apply.enqueue(queue, rows)
