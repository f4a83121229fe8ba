"""The OpenCL decode engine: a Llama forward pass over a paged KV pool.

One `step` runs any mix of prefill chunks and decodes, for any subset of turns
at any positions, as ONE flat batch of tokens: every weight is read once per
step whatever the batch holds. Per layer (x is the residual stream, [T, d]):

    xn  = rmsnorm(x) * attn_norm
    qkv = xn @ [Wq | Wk | Wv]^T                    one matmul for all three
    q, k = rope(q, k); K/V cache[pos] = k, v       through each turn's block table
    x  += attention(q, K, V) @ Wo^T                causal, grouped-query; residual fused
    xn  = rmsnorm(x) * ffn_norm
    h   = silu(xn @ Wgate^T) * (xn @ Wup^T)        one fused kernel
    x  += h @ Wdown^T                              residual fused

then, only for the items that sample, logits = rmsnorm(x_last) @ Wout^T.

That is five kernel launches per layer (kernels/matmul.cl fuses each norm, RoPE
and the K/V store, SwiGLU and the residual adds into the matmuls), all bound to
their buffers once at start-up. The whole step is enqueued without a host sync;
the logits are the one read-back.
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np
import pyopencl as cl

from gpu.device import Device, select_device
from gpu.kvcache import KVPool, choose_num_blocks
from gpu.model import Model, load_model
from gpu.sampling import sample_batch
from gpu.tokenizer import Tokenizer
from gpu.weights import DeviceMatrix, upload_weights
from kernels import source
from runtime.cost import StepCost
from runtime.engine import Work
from runtime.errors import ConfigError, UnsupportedModelError

i32 = np.int32
RW = cl.mem_flags.READ_WRITE
WG = 16  # work-group size of the matmul kernels (each work-item owns two rows)


def _tile(ncols: int) -> int:
    """The matmul kernel variant: how many batch columns one weight read serves."""
    return 1 if ncols == 1 else 2 if ncols == 2 else 4 if ncols <= 4 else 8


class OpenCLEngine:
    """Implements `runtime.engine.Engine` on an OpenCL device."""

    def __init__(
        self,
        model: str | Model,
        *,
        device: str | Device | None = None,
        block_size: int = 16,
        num_blocks: int | None = None,
        kv_fraction: float = 0.25,
        max_batch_tokens: int = 256,
    ):
        self.model = model if isinstance(model, Model) else load_model(model)
        cfg = self.config = self.model.config
        if block_size % 16:
            raise ConfigError(f"block_size must be a multiple of 16 (the attention kernel's width), got {block_size}")
        if cfg.head_dim % 16 or cfg.d_model % 32 or cfg.d_ff % 32 or cfg.n_heads % cfg.n_kv_heads:
            raise UnsupportedModelError(
                f"{self.model.path}: the kernels need head_dim % 16 == 0, d_model and d_ff % 32 == 0 "
                f"and n_heads a multiple of n_kv_heads (got {cfg})"
            )
        self.device = device if isinstance(device, Device) else select_device(device)
        self.device_name = self.device.name
        self.block_size = block_size
        self.num_blocks = num_blocks or choose_num_blocks(self.device, cfg, block_size, kv_fraction)
        self.max_batch_tokens = max_batch_tokens
        self.kv = KVPool(self.device, cfg, block_size, self.num_blocks)
        self.weights = upload_weights(self.device.context, self.model)
        self._build()
        self._allocate(max_batch_tokens)
        self._bind()
        self.cost = StepCost()  # a placeholder until `calibrate` measures this device
        self.calibrated = False

    # ------------------------------------------------------------------ setup

    def _build(self) -> None:
        cfg = self.config
        options = [
            f"-DHEAD_DIM={cfg.head_dim}",
            f"-DN_HEADS={cfg.n_heads}",
            f"-DN_KV_HEADS={cfg.n_kv_heads}",
            f"-DN_LAYERS={cfg.n_layers}",
            f"-DBLOCK_SIZE={self.block_size}",
            f"-DWG={WG}",
            f"-DMAX_COLS={self.max_batch_tokens}",
        ]
        text = "\n".join(source(name) for name in ("quant", "layers", "matmul"))
        self._program = self.device.build(text, options)

    def _allocate(self, t: int) -> None:
        """Buffers for a step of up to `t` tokens, made once."""
        cfg, ctx = self.config, self.device.context
        f = lambda n: cl.Buffer(ctx, RW, 4 * n)  # noqa: E731
        qkv_dim = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
        self._x = f(t * cfg.d_model)
        self._qkv, self._att = f(t * qkv_dim), f(t * cfg.n_heads * cfg.head_dim)
        self._h = f(t * cfg.d_ff)
        self._tokens, self._pos, self._seq, self._sample_rows = f(t), f(t), f(t), f(t)
        self._all_rows = cl.Buffer(
            ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=np.arange(t, dtype=i32)
        )
        inv_freq = cfg.rope_base ** (-np.arange(0, cfg.head_dim, 2, dtype=np.float64) / cfg.head_dim)
        self._inv_freq = cl.Buffer(
            ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=inv_freq.astype(np.float32)
        )
        ones = np.ones(max(cfg.d_model, cfg.d_ff, cfg.n_heads * cfg.head_dim), np.float32)
        self._ones = cl.Buffer(ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=ones)
        self._max_blocks = -(-cfg.context_length // self.block_size)  # block table width
        self._tables = f(t * self._max_blocks)
        self._logits = f(t * cfg.vocab_size)

    def _bind(self) -> None:
        """Every launch of a step with its arguments set once (pyopencl's per-call
        argument setting cost more host time than the kernels took at batch 1)."""
        cfg, W = self.config, self.weights
        width, eps = i32(self._max_blocks), np.float32(cfg.norm_eps)
        self._embed = _Grid(self._program, f"embed_{W.embed.kind}", cfg.d_model // 32,
                            W.embed.qs, W.embed.dm, self._tokens, self._x, i32(cfg.d_model))  # fmt: skip

        def matmul(op, w, g, x, xrows, y, *extra):
            return _Matmul(self._program, op, w, (w.qs, w.dm, g, x, xrows, eps, y), extra)

        self._layers = []
        for layer, L in enumerate(W.layers):
            kv = (self._pos, self._seq, self._tables, width, self._inv_freq, self.kv.k, self.kv.v, i32(layer))
            self._layers += [
                matmul("qkv", L.qkv, L.attn_norm, self._x, self._all_rows, self._qkv, *kv),
                _Grid(self._program, "attention", cfg.n_heads, self._qkv, self._pos, self._seq, self._tables, width,
                      self.kv.k, self.kv.v, self._att, i32(layer)),  # fmt: skip
                matmul("matmul", L.out, self._ones, self._att, self._all_rows, self._x, i32(0), i32(1)),
                matmul("swiglu", L.gate_up, L.ffn_norm, self._x, self._all_rows, self._h),
                matmul("matmul", L.down, self._ones, self._h, self._all_rows, self._x, i32(0), i32(1)),
            ]
        self._head = matmul("matmul", W.output, W.output_norm, self._x, self._sample_rows, self._logits, i32(1), i32(0))

    # --------------------------------------------------------------- protocol

    @functools.cached_property
    def tokenizer(self) -> Tokenizer:
        return Tokenizer.from_model(self.model)

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

    def step(self, batch: Sequence[Work]) -> list[int | None]:
        logits = self.step_logits(batch)
        sampled = [w for w in batch if w.sample]
        tokens = iter(
            sample_batch(logits, [w.sampling for w in sampled], [w.start + len(w.tokens) for w in sampled])
            if sampled
            else []
        )
        return [int(next(tokens)) if w.sample else None for w in batch]

    def swap_out(self, turn: int, blocks: Sequence[int], length: int) -> None:
        self.kv.swap_out(turn, blocks, length)

    def swap_in(self, turn: int, blocks: Sequence[int]) -> None:
        self.kv.swap_in(turn, blocks)

    def forget(self, turn: int) -> None:
        self.kv.forget(turn)

    # ------------------------------------------------------------------ steps

    def step_logits(self, batch: Sequence[Work]) -> np.ndarray:
        """Run a step; the logits (n_sampled, vocab) at the last position of each
        item with `sample` set, in batch order. Writes K/V like `step`."""
        self._check(batch)
        tokens = np.array([t for w in batch for t in w.tokens], dtype=i32)
        pos = np.concatenate([np.arange(w.start, w.start + len(w.tokens), dtype=i32) for w in batch])
        seq = np.repeat(np.arange(len(batch), dtype=i32), [len(w.tokens) for w in batch])
        tables = np.zeros((len(batch), self._max_blocks), dtype=i32)
        for s, w in enumerate(batch):
            need = -(-(w.start + len(w.tokens)) // self.block_size)
            tables[s, :need] = w.block_table[:need]
        ends = np.cumsum([len(w.tokens) for w in batch]) - 1
        sample_at = np.array([e for e, w in zip(ends, batch) if w.sample], dtype=i32)

        # A step longer than the buffers runs as consecutive sub-steps; that is
        # exact, since a later sub-step sees the K/V the earlier ones stored.
        out = []
        m = self.max_batch_tokens
        for c0 in range(0, len(tokens), m):
            c1 = min(c0 + m, len(tokens))
            rows = sample_at[(sample_at >= c0) & (sample_at < c1)] - c0
            turns, local_seq = np.unique(seq[c0:c1], return_inverse=True)
            logits = self._forward(tokens[c0:c1], pos[c0:c1], local_seq.astype(i32), tables[turns], rows.astype(i32))
            if logits is not None:
                out.append(logits)
        if not out:
            return np.zeros((0, self.config.vocab_size), np.float32)
        return np.concatenate(out)

    def _check(self, batch: Sequence[Work]) -> None:
        if not batch:
            raise ValueError("an engine step needs at least one Work item")
        turns = [w.turn for w in batch]
        if len(set(turns)) != len(turns):
            raise ValueError(f"a step may hold at most one Work per turn, got turns {turns}")
        vocab, ctx = self.config.vocab_size, self.config.context_length
        for w in batch:
            if not w.tokens:
                raise ValueError(f"turn {w.turn}: Work with no tokens")
            if w.start < 0:
                raise ValueError(f"turn {w.turn}: negative start {w.start}")
            end = w.start + len(w.tokens)
            if end > ctx:
                raise ValueError(f"turn {w.turn}: positions up to {end} exceed the context length {ctx}")
            if min(w.tokens) < 0 or max(w.tokens) >= vocab:
                raise ValueError(f"turn {w.turn}: token ids must be in [0, {vocab})")
            need = -(-end // self.block_size)
            if len(w.block_table) < need:
                raise ValueError(
                    f"turn {w.turn}: block table of {len(w.block_table)} blocks covers "
                    f"{len(w.block_table) * self.block_size} positions, the work reaches position {end - 1}"
                )
            self.kv.check_blocks(w.block_table[:need], f"turn {w.turn}")

    def _forward(self, tokens, pos, seq, tables, sample_rows) -> np.ndarray | None:
        q, t, n = self.device.queue, len(tokens), len(sample_rows)
        for buf, arr in ((self._tokens, tokens), (self._pos, pos), (self._seq, seq), (self._tables, tables)):
            cl.enqueue_copy(q, buf, np.ascontiguousarray(arr), is_blocking=False)
        if n:
            cl.enqueue_copy(q, self._sample_rows, sample_rows, is_blocking=False)
        self._embed.enqueue(q, t)
        for launch in self._layers:
            launch.enqueue(q, t)
        if n == 0:
            q.finish()
            return None
        self._head.enqueue(q, n)
        logits = np.empty((n, self.config.vocab_size), np.float32)
        cl.enqueue_copy(q, logits, self._logits, is_blocking=True)
        return logits


class _Grid:
    """A kernel over a (dim0, tokens) grid, its arguments set once."""

    def __init__(self, program: cl.Program, name: str, dim0: int, *args):
        self.kernel = cl.Kernel(program, name)
        self.kernel.set_args(*args)
        self.dim0 = dim0

    def enqueue(self, queue: cl.CommandQueue, t: int) -> None:
        cl.enqueue_nd_range_kernel(queue, self.kernel, (self.dim0, t), (1, 1))


class _Matmul:
    """One fused matmul (kernels/matmul.cl; op is matmul, swiglu or qkv) bound to its
    weights and buffers, in every tile variant; a step only sets the batch width."""

    NCOLS = 9  # index of the ncols argument

    def __init__(self, program: cl.Program, op: str, w: DeviceMatrix, head: tuple, extra: tuple):
        rows = w.rows // 2 if op == "swiglu" else w.rows
        pairs = -(-rows // 2)
        self.global_size = (-(-pairs // WG) * WG,)
        self.tiles = {}
        for tile in (1, 2, 4, 8):
            kernel = cl.Kernel(program, f"{op}_{w.kind}_t{tile}")
            kernel.set_args(*head, i32(rows), i32(w.cols), i32(1), *extra)
            self.tiles[tile] = kernel

    def enqueue(self, queue: cl.CommandQueue, ncols: int) -> None:
        kernel = self.tiles[_tile(ncols)]
        kernel.set_arg(self.NCOLS, i32(ncols))
        cl.enqueue_nd_range_kernel(queue, kernel, self.global_size, (WG,))
