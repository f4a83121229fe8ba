"""Kernel families: the same forward pass shaped for a CPU or for a GPU.

    family = make_family("auto", device)   # "cpu" on a CPU device, else "gpu"
    program = device.build(family.source(), family.options(engine))
    step = family.bind(engine, program)    # the launches of one step, bound once

Both families read the same weights (gpu/weights.py, dequantized by
kernels/quant.cl), store the same half-precision KV layout (kernels/common.cl)
and sample greedily on the device: the lowest index among equal maxima (the CPU
family's argmax scans a row in one work-item, kernels/cpu/argmax.cl).

- cpu: a work-item walks whole rows with 16-wide vectors, small work-groups (PoCL
  runs a work-group on one core). Five launches per layer (plus a norm per
  residual add for post-norm models, and the Q/K norm for QK-norm ones; and
  for a batch of more than 8 tokens, before each integer matmul, one that
  quantizes its inputs once for all its work-groups: gpu/launches.py's CPUStage).
  A one-token step takes one launch a layer where the model allows (CPULayer).
- gpu: work-groups cooperate on rows with reductions, prefill tiles through
  local memory, attention parallel over positions. Five launches per layer
  (plus the same extras). Work-group sizes come from the device.

`--kernels cpu|gpu` forces either on any device: PoCL runs the GPU family
correctly, only slower, so both are tested everywhere.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import pyopencl as cl

from gpu import subgroups
from gpu.device import Device
from gpu.devicesampling import SampleHot
from gpu.launches import (
    LAYER_WTYPES,
    LOWBIT_KINDS,
    NIBBLE_VARIANTS,
    OP_MATMUL,
    OP_QKV,
    OP_SWIGLU,
    SUPER_KINDS,
    ApplyMask,
    Argmax,
    CPUAttention,
    CPULayer,
    CPUMatmul,
    GPUAttention,
    GPUMatmul,
    Grid,
    Stage,
    ZeroCounters,
    cpu_variant,
    local_bytes,
)
from gpu.model.load import Model
from gpu.weights import COMPACT, ModelWeights, Q, upload_weights
from kernels import source
from runtime.errors import ConfigError, UnsupportedModelError
from runtime.scheduling.units import ceil_div

if TYPE_CHECKING:
    from gpu.engine import OpenCLEngine

KERNEL_CHOICES = ("auto", "cpu", "gpu")
i32 = np.int32


class Launch(Protocol):
    name: str
    weight_bytes: int

    def enqueue(self, queue: cl.CommandQueue, n: int) -> cl.Event | None: ...  # None: nothing to do for n


@dataclass
class StepLaunches:
    """Everything one step enqueues, in order: embed, the layers' launches (each
    sized by the step's tokens), the head (by sampled rows), the constrained
    rows' masks, argmax, then the rows sampled at a temperature (gpu.devicesampling)."""

    embed: Launch
    layers: list[Launch]
    kv_only: int  # layers[:kv_only] end at the last layer's K/V store: all a step sampling no row needs
    head: list[Launch]
    argmax: Argmax
    sample: SampleHot
    mask: ApplyMask  # before argmax and sample, where a row is constrained (gpu.masks)
    one_token: list[Launch] | None = None  # a one-token step's layers a launch each (CPULayer), where the family has them


@dataclass(frozen=True)
class GPUTuning:
    """The GPU family's choices a test can force: positions per attention split
    (small spans split short contexts), and how a matmul row's lanes are added
    (gpu/subgroups.py: auto, khr, local or emulated)."""

    span: int = 256
    subgroups: str = "auto"


def compact_layouts(default: frozenset) -> frozenset:
    """Which of Q4_K, Q6_K and Q5_0 keep their file's bytes on the device (gpu/weights.py's
    compact kinds): SLOTSWARM_COMPACT=1 all three, 0 none, for every family; else the
    family's default. The CPU family's is Q4_K and Q6_K: their compact kernels keep the
    sub-block scales as integers, one float a super-block, and a Qwen2.5-Coder-1.5B step
    reads a quarter fewer bytes, at every batch and prompt faster than the widened kinds.
    Compact Q5_0 is slower per weight at any batch. The GPU family's default is none: on
    an H200 its compact kinds were slower (README, "On a GPU")."""
    setting = os.environ.get("SLOTSWARM_COMPACT", "")
    if setting == "":
        return default
    return frozenset(COMPACT) if setting != "0" else frozenset()


def make_family(kernels: str | None, device: Device, tuning: GPUTuning | None = None) -> CPUFamily | GPUFamily:
    choice = kernels or "auto"
    if choice not in KERNEL_CHOICES:
        raise ConfigError(f"kernels must be one of {', '.join(KERNEL_CHOICES)}, got {kernels!r}")
    if choice == "auto":
        choice = "cpu" if device.is_cpu else "gpu"
    return CPUFamily(device) if choice == "cpu" else GPUFamily(device, tuning or GPUTuning())


class CPUFamily:
    name = "cpu"
    SOURCES = ("quant", "common", "cpu/attention", "cpu/matmul", "cpu/lowbit", "cpu/nibbles", "cpu/layer", "cpu/argmax")
    # Matmul work-groups of 64 work-items, each owning two rows. PoCL runs a work-group on
    # one core, and each quantizes (or reads) its inputs once and meets a barrier or two,
    # which smaller groups pay more often than the balance between cores is worth, even
    # where a matrix (576 rows) makes only five groups. (Sizes compared: in the commit.)
    WG = 64
    LOWBIT_WG = 32  # q2/q3 matmuls: a work-group quantizes its inputs once for 64 rows
    ARGMAX_WG = 16  # common.cl's per-row kernels (sample_hot): a row's work-items share it
    splits_stacks = True  # a QKV stack of different types as parts, one launch each (cpu/matmul.cl's qkv)
    COMPACT = frozenset({Q.Q4_K, Q.Q6_K})  # compact_layouts says why

    def __init__(self, device: Device):
        self.wg, self.argmax_wg = self.WG, self.ARGMAX_WG
        self.local_mem = int(device.device.local_mem_size)
        # attention by KV head (cpu/attention.cl's attention_group) where a step has
        # a few work-items a core of them, else by query head (gpu/launches.py)
        self.attention_items = 4 * int(device.device.max_compute_units)
        # SLOTSWARM_VNNI=0 turns the integer kernels' vpdpwssd and vpdpbusd off (both
        # widths: AVX-512 VNNI, and AVX-VNNI where the kernels are AVX2's); SLOTSWARM_GEMM=1 takes
        # the 32-column prompt tiles for every nibble kind, 0 for none, and unset for the
        # kinds they pay for (cpu/nibbles.cl's pair_dot_nibbles says which); either way
        # the same bits, so the settings can be compared on any model
        vnni = device.is_cpu and os.environ.get("SLOTSWARM_VNNI", "1") != "0"
        self.vnni = frozenset(width for width in (512, 256) if vnni and host_has_vnni(width))
        self.gemm = os.environ.get("SLOTSWARM_GEMM")
        self.compact = compact_layouts(default=self.COMPACT)
        # compact Q4_K and Q6_K on 8-bit inputs, as llama.cpp's CPU back end takes them
        # (cpu/nibbles.cl's INT8_INPUTS): faster steps, prompts and batches, for logits a little
        # coarser than 16-bit inputs give; SLOTSWARM_INT8=0 keeps the 16 bits, and =all takes
        # Q4_0 and Q4_1 on 8 bits too (INT8_NIBBLES), which moves SmolLM2-135M's answers
        setting = os.environ.get("SLOTSWARM_INT8", "1")
        if setting not in ("0", "1", "all"):
            raise ConfigError(f"SLOTSWARM_INT8 must be 0, 1 or all, got {setting!r}")
        self.int8, self.int8_nibbles = setting != "0", setting == "all"
        # a one-token step's layers a launch each (kernels/cpu/layer.cl) where the model allows;
        # SLOTSWARM_LAYER_LAUNCH=0 keeps their five, the same bits, to compare
        self.layer_launch = os.environ.get("SLOTSWARM_LAYER_LAUNCH", "1") != "0"
        self.cores = int(device.device.max_compute_units)  # decode_layer's work-groups

    def source(self) -> str:
        return "\n".join(source(name) for name in self.SOURCES)

    def input_bits(self, kind: str) -> int:
        """How many bits the matmuls of a device kind round their inputs to: 8 for compact
        Q4_K and Q6_K with SLOTSWARM_INT8, and Q4_0 and Q4_1 with =all, else 16."""
        return 8 if self.int8 and (kind in SUPER_KINDS or (self.int8_nibbles and kind == "q4_1")) else 16

    def options(self, engine: OpenCLEngine) -> list[str]:
        # only the matmuls of the kinds this model reads (cpu/matmul.cl's MATMUL_KINDS)
        kinds = {cpu_variant(part.kind) for m in engine.weights.matrices() for part in m.parts or [m]}
        return [f"-DWG={self.wg}", f"-DLOWBIT_WG={self.LOWBIT_WG}", f"-DMAX_COLS={engine.max_batch_tokens}",
                f"-DARGMAX_WG={self.argmax_wg}", f"-DDOT_VNNI={int(512 in self.vnni)}", f"-DAVX_VNNI={int(256 in self.vnni)}",
                f"-DINT8_INPUTS={int(self.int8)}", f"-DINT8_NIBBLES={int(self.int8_nibbles)}",
                f"-DPREFETCH_AHEAD={prefetch_ahead(engine.config.d_ff)}",
                "-DMATMUL_KINDS", *(f"-DMATMUL_{kind}" for kind in sorted(kinds))]  # fmt: skip

    def check(self, engine: OpenCLEngine) -> None:
        pass

    def bind(self, e: OpenCLEngine, program: cl.Program) -> StepLaunches:
        cfg, W, b = e.config, e.weights, e.buffers
        width, eps = i32(e.max_blocks), np.float32(cfg.norm_eps)

        local_mem = self.local_mem - 4 * e.max_batch_tokens  # less the kernels' RMS scales
        nibbles = [part for m in W.matrices() for part in m.parts or [m] if part.kind in NIBBLE_VARIANTS]
        stage = Stage(e.device.context, max(w.cols for w in nibbles), e.max_batch_tokens) if nibbles else None

        def matmul(name, kernel, w, g, x, xrows, y, *extra):
            wg = self.LOWBIT_WG if w.kind in LOWBIT_KINDS else self.wg
            gemm = self.gemm == "1" if self.gemm in ("0", "1") else self.int8 and w.kind in SUPER_KINDS
            return CPUMatmul(name, program, kernel, wg, w, (w.qs, w.dm, g, x, xrows, eps, y), extra, local_mem, gemm, stage,
                             self.int8, self.cores)  # fmt: skip

        def staged(m: CPUMatmul) -> list[Launch]:
            """A matmul, after the launch that stages its inputs where it has one."""
            return [m.stage_inputs, m] if m.stage_inputs else [m]

        def qkv(L, layer):
            """The QKV matmul, a launch per part of a split stack."""
            kv = (b.pos, b.seq, b.tables, width, L.rope, e.kv.k, e.kv.v, i32(layer))
            parts = [matmul("qkv", "qkv", part, L.attn_norm, b.x, b.all_rows, b.qkv, *kv) for part in L.qkv.parts or [L.qkv]]
            return [launch for part in parts for launch in staged(part)]

        def residual(name, w, x, post_norm):
            """x += w . x_in, or with post-norms x += rmsnorm(w . x_in) * post_norm."""
            if post_norm is None:
                return staged(matmul(name, "matmul", w, b.ones, x, b.all_rows, b.x, i32(0), i32(1)))
            return staged(matmul(name, "matmul", w, b.ones, x, b.all_rows, b.tmp, i32(0), i32(0))) + [
                Grid("post_norm", program, "add_rmsnorm", 1, (1, 1), b.x, b.tmp, post_norm, i32(cfg.d_model))]  # fmt: skip

        layers: list[Launch] = []
        for layer, L in enumerate(W.layers):
            # Attention and embedding as 1x1 work-groups: PoCL would put a whole
            # (heads, tokens) grid in one work-group, on one core.
            layers += qkv(L, layer)
            layers += qk_norm(program, e, L, layer)
            kv_only = len(layers)
            layers.append(CPUAttention(program, cfg.n_heads, cfg.n_kv_heads, self.attention_items, b.qkv, b.pos, b.seq,
                                       b.tables, width, e.kv.k, e.kv.v, b.att, i32(layer), i32(cfg.window(layer))))  # fmt: skip
            layers += residual("out", L.out, b.att, L.post_attn_norm)
            layers += staged(matmul("swiglu", "swiglu", L.gate_up, L.ffn_norm, b.x, b.all_rows, b.h))
            layers += residual("down", L.down, b.h, L.post_ffw_norm)
        return StepLaunches(
            one_token=self.one_token_layers(e, program),
            embed=Grid(
                "embed",
                program,
                f"embed_{W.embed.kind}",
                cfg.d_model // 32,
                (1, 1),
                W.embed.qs,
                W.embed.dm,
                b.tokens,
                b.x,
                i32(cfg.d_model),
            ),  # fmt: skip
            layers=layers,
            kv_only=kv_only,
            head=staged(matmul("head", "matmul", W.output, W.output_norm, b.x, b.sample_rows, b.logits, i32(1), i32(0))),
            argmax=Argmax(program, 1, b.logits, cfg.vocab_size, b.ids, kernel="argmax_lanes"),
            sample=SampleHot(program, self.argmax_wg, b.logits, cfg.vocab_size, b.hot_rows, b.hot_params, b.ids, b.found),
            mask=ApplyMask(program, b.logits, cfg.vocab_size, b.mask_rows, b.masks),
        )

    def one_token_layers(self, e: OpenCLEngine, program: cl.Program) -> list[Launch] | None:
        """A one-token step's layers as one CPULayer each, after the launch that zeroes their
        counters; None where a layer needs launches decode_layer does not make (a matrix of
        another kind than the nibble ones, post-norms, a Q/K norm), where it is turned off,
        and on a profiled engine, whose profile times each matmul."""
        cfg, W, b = e.config, e.weights, e.buffers
        if not (layer_launch_fits(W) and self.layer_launch) or e.profile:
            return None
        counters = ZeroCounters(e.device.context, len(W.layers))
        launches: list[Launch] = [counters]
        for layer, L in enumerate(W.layers):
            parts = L.qkv.parts or [L.qkv]
            # each part's inputs in the local buffer after the one before's, 64 bytes aligned
            starts = np.cumsum([0] + [ceil_div(local_bytes(p, 1), 64) * 64 for p in parts])
            local = max(int(starts[-1]), *(local_bytes(m, 1) for m in (L.out, L.gate_up, L.down)))
            stack = []
            for i in range(3):
                p = parts[min(i, len(parts) - 1)]
                stack += [p.qs, p.dm, i32(LAYER_WTYPES[p.kind]), i32(p.rows if i < len(parts) else 0)]
            launches.append(CPULayer(program, self.cores, layer_matrices(L), *stack,
                                     *(arg for m in (L.out, L.gate_up, L.down) for arg in (m.qs, m.dm, i32(LAYER_WTYPES[m.kind]))),
                                     L.attn_norm, L.ffn_norm, np.float32(cfg.norm_eps), i32(cfg.d_model), i32(cfg.d_ff),
                                     b.x, b.all_rows, b.qkv, b.att, b.h, b.pos, b.seq, b.tables, i32(e.max_blocks),
                                     L.rope, e.kv.k, e.kv.v, i32(layer), i32(cfg.window(layer)),
                                     counters.buffer, cl.LocalMemory(local), i32(starts[1]), i32(starts[min(2, len(parts))])))  # fmt: skip
        return launches


def layer_matrices(L) -> list:
    """A layer's matrices in decode_layer's order: the QKV stack's parts, out, gate_up, down."""
    return [*(L.qkv.parts or [L.qkv]), L.out, L.gate_up, L.down]


def layer_launch_fits(weights: ModelWeights) -> bool:
    """Whether decode_layer (kernels/cpu/layer.cl) can take every layer of these weights:
    matrices of the nibble kinds only, a QKV stack of at most three parts, and no post-norms
    or Q/K norm, whose launches it does not make."""
    return all(
        all(m.kind in LAYER_WTYPES for m in layer_matrices(L)) and len(L.qkv.parts) <= 3
        and L.post_attn_norm is None and L.post_ffw_norm is None and L.q_norm is None
        for L in weights.layers
    )  # fmt: skip


class GPUFamily:
    name = "gpu"
    splits_stacks = False  # its kernels read a stack as one matrix of one kind
    int8 = int8_nibbles = False  # its matmuls take float inputs (SLOTSWARM_INT8 is the CPU family's)
    SOURCES = ("quant", "common", "gpu/reduce", "gpu/matmul", "gpu/attention")
    MAX_WG = 256
    MAX_SPLITS = 16

    def __init__(self, device: Device, tuning: GPUTuning):
        if tuning.span < 1:
            raise ConfigError(f"attention splits need a span of at least one position, got {tuning.span}")
        self.span = tuning.span
        self.compact = compact_layouts(default=frozenset())
        self.c_version = device.device.opencl_c_version
        self.subgroups = subgroups.choose(device.device.extensions, self.c_version, tuning.subgroups)
        self.lanes = subgroups.MAX_LANES  # the most lanes a matmul unit has (set by fit)
        # The largest power of two the device allows, up to 256: a multiple of
        # every GPU's warp/wavefront (32 or 64) and of its preferred multiple.
        limit = min(self.MAX_WG, int(device.device.max_work_group_size))
        if limit < 16:
            raise ConfigError(f"{device.name}: work-groups of {limit} work-items are too small for the GPU kernels")
        self.wg = self.argmax_wg = 1 << (limit.bit_length() - 1)

    def source(self) -> str:
        return "\n".join(source(name) for name in self.SOURCES)

    def options(self, engine: OpenCLEngine) -> list[str]:
        return [f"-DWG={self.wg}", f"-DARGMAX_WG={self.argmax_wg}",
                f"-DMAX_SPLITS={self.MAX_SPLITS}", f"-DSPLIT_SPAN={self.span}",
                *subgroups.build_options(self.subgroups, self.c_version)]  # fmt: skip

    def splits(self, positions: int) -> int:
        """Work-groups per (token, KV head) in attention for a step whose longest
        token sees `positions`: one per span of them, at most MAX_SPLITS (attention.cl
        widens the span past that). Each token uses only the splits its own
        positions need, so its sums never depend on the rest of the step."""
        return max(1, min(self.MAX_SPLITS, ceil_div(positions, self.span)))

    def split_count(self, e: OpenCLEngine, window: int):
        """A layer's attention splits for the step: a sliding window caps the positions."""
        return lambda: self.splits(min(e.step_positions, window or e.step_positions))

    def check(self, engine: OpenCLEngine) -> None:
        cfg = engine.config
        if (cfg.n_heads // cfg.n_kv_heads * cfg.head_dim) % 32:
            raise UnsupportedModelError(
                f"{engine.model.path}: the GPU kernels need (n_heads / n_kv_heads) * head_dim to be a multiple of 32"
            )

    def fit(self, program: cl.Program, device: Device) -> bool:
        """Whether every kernel can run work-groups of self.wg on this device (a
        kernel's register use can lower its limit below the device's); if not, the
        work-groups halve and the engine builds again. With subgroups, this also
        reads their size; where the device will not say, the matmuls fall back to
        local memory and the engine builds again."""
        info = cl.kernel_work_group_info.WORK_GROUP_SIZE
        if self.wg > 16 and not all(k.get_work_group_info(info, device.device) >= self.wg for k in program.all_kernels()):
            self.wg //= 2
            return False
        mv = [k for k in program.all_kernels() if k.function_name.startswith("mv_")]
        lanes = subgroups.lane_cap(self.subgroups, mv, device.device, self.wg)
        if lanes is None:
            return self.fall_back()
        self.lanes = lanes
        return True

    def fall_back(self) -> bool:
        """After a failed build or an unknown subgroup size: matmuls through local
        memory instead of subgroups. False where there is nothing to fall back to."""
        if self.subgroups != "khr":
            return False
        self.subgroups = "local"
        return True

    def bind(self, e: OpenCLEngine, program: cl.Program) -> StepLaunches:
        cfg, W, b = e.config, e.weights, e.buffers
        width, eps = i32(e.max_blocks), np.float32(cfg.norm_eps)
        none = (i32(0), i32(0), b.pos, b.seq, b.tables, width, W.layers[0].rope, e.kv.k, e.kv.v, i32(0))
        normalized = (i32(1),) + none[1:]
        residual = (i32(0), i32(1)) + none[2:]

        def matmul(name, op, w, g, x, xrows, y, tail):
            return GPUMatmul(name, program, op, self.wg, self.lanes, w, (w.qs, w.dm, g, x, xrows, eps, y) + tail)

        def post_norm(y, w):
            """x += rmsnorm(y) * w: the residual add of post-norm models."""
            return Grid("post_norm", program, "add_rmsnorm_wide", self.wg, (self.wg, 1), b.x, y, w, i32(cfg.d_model))

        layers: list[Launch] = []
        for layer, L in enumerate(W.layers):
            kv = (i32(1), i32(0), b.pos, b.seq, b.tables, width, L.rope, e.kv.k, e.kv.v, i32(layer))
            window = cfg.window(layer)
            layers.append(matmul("qkv", OP_QKV, L.qkv, L.attn_norm, b.x, b.all_rows, b.qkv, kv))
            layers += qk_norm(program, e, L, layer)
            kv_only = len(layers)
            attention = (b.qkv, b.pos, b.seq, b.tables, width, e.kv.k, e.kv.v, i32(layer), i32(window), b.att,
                         b.split_scratch, b.split_counters)  # fmt: skip
            layers.append(GPUAttention(program, self.wg, cfg.n_kv_heads, attention, self.split_count(e, window)))
            if L.post_attn_norm is None:  # each sublayer's last matmul adds into x
                layers += [
                    matmul("out", OP_MATMUL, L.out, b.ones, b.att, b.all_rows, b.x, residual),
                    matmul("swiglu", OP_SWIGLU, L.gate_up, L.ffn_norm, b.x, b.all_rows, b.h, normalized),
                    matmul("down", OP_MATMUL, L.down, b.ones, b.h, b.all_rows, b.x, residual),
                ]
            else:  # a norm needs the sublayer's whole output first
                layers += [
                    matmul("out", OP_MATMUL, L.out, b.ones, b.att, b.all_rows, b.tmp, none),
                    post_norm(b.tmp, L.post_attn_norm),
                    matmul("swiglu", OP_SWIGLU, L.gate_up, L.ffn_norm, b.x, b.all_rows, b.h, normalized),
                    matmul("down", OP_MATMUL, L.down, b.ones, b.h, b.all_rows, b.tmp, none),
                    post_norm(b.tmp, L.post_ffw_norm),
                ]
        return StepLaunches(
            embed=Grid(
                "embed", program, f"embed_{W.embed.kind}", cfg.d_model // 32, None, W.embed.qs, W.embed.dm, b.tokens, b.x, i32(cfg.d_model)
            ),  # fmt: skip
            layers=layers,
            kv_only=kv_only,
            head=[matmul("head", OP_MATMUL, W.output, W.output_norm, b.x, b.sample_rows, b.logits, normalized)],
            argmax=Argmax(program, self.argmax_wg, b.logits, cfg.vocab_size, b.ids),
            sample=SampleHot(program, self.argmax_wg, b.logits, cfg.vocab_size, b.hot_rows, b.hot_params, b.ids, b.found),
            mask=ApplyMask(program, b.logits, cfg.vocab_size, b.mask_rows, b.masks),
        )


def family_weights(family: CPUFamily | GPUFamily, device: Device, model: Model) -> ModelWeights:
    """A model's weights on the device as `family`'s kernels read them: its QKV stacks split
    or not, and its compact kinds."""
    return upload_weights(device.context, model, split_stacks=family.splits_stacks, compact=family.compact)


def prefetch_ahead(widest_row: int) -> int:
    """How many bytes ahead the CPU matmuls prefetch their weights (cpu/matmul.cl),
    growing with the model's widest rows (its down projection's, `d_ff` inputs). A
    small model's rows fit several times in 4 KB, and reaching further only evicts
    what is read next: rows of at most 2,048 inputs (SmolLM2, Gemma 3 270M) take 2 KB.
    Past rows of 8 KB (Qwen2.5-Coder-1.5B's 8,960 inputs, about a byte a weight: 10 KB
    a row pair), 8 KB: further reaches into a one-token step's next run of row pairs
    (cpu/layer.cl), which the other core may be the one to read."""
    return 2048 if widest_row <= 2048 else 8192 if widest_row > 8192 else 4096


def host_has_vnni(width: int = 512) -> bool:
    """Whether this machine's CPU has VNNI's vpdpwssd and vpdpbusd at a vector width: 512
    bits AVX-512 VNNI, 256 the VEX forms of AVX-VNNI (Linux's /proc/cpuinfo flags). PoCL's
    CPU device is the host, and its compiler will not say (see cpu/lowbit.cl)."""
    flag = {512: "avx512_vnni", 256: "avx_vnni"}[width]
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return flag in line.split()
    except OSError:
        pass
    return False


def qk_norm(program: cl.Program, e: OpenCLEngine, L, layer: int) -> list[Launch]:
    """The per-head Q/K norm launch (common.cl) of architectures with one: it also does
    the RoPE and K store the QKV matmul left undone."""
    if L.q_norm is None:
        return []
    cfg, b = e.config, e.buffers
    return [Grid("qk_norm", program, "qk_norm_rope", cfg.n_heads + cfg.n_kv_heads, (1, 1), b.qkv, b.pos, b.seq,
                 b.tables, i32(e.max_blocks), L.rope, L.q_norm, L.k_norm, e.kv.k, i32(layer))]  # fmt: skip
