"""Model weights on the device, still quantized.

GGUF stores a quantized row as a run of blocks (32 weights, or 256 for the
K-quants), each its scale(s) then its quants. Those blocks are not 16-byte
aligned, so the upload repacks every type into blocks of 32 in one of a few
device kinds (kernels/quant.cl lists them), so kernels use aligned vector loads.
The repacking is exact. Batch-1 decode reads every weight byte once a step, so
the types of the coding models (Q4_K, Q6_K, Q5_0) can keep their file's bytes
(`compact`; which ones, per kernel family: gpu/families.py's compact_layouts), only
moved: a group of 8 blocks' quants, then its scales (the compact kinds q4_k, q6_k,
q5_0; Q4_K's and Q6_K's reordered within their bytes for the CPU kernels, and their
groups in row pairs, so a matmul's two rows are one run of bytes; the kernels read
f16 as bits). The others keep the quants
(`qs`, nibbles or int8) in one array and the scales (`dm`, widened to float32)
in another, every Q5_1/Q5_K sub-block its own (scale, offset), except Q2_K and
Q3_K, which stay whole super-blocks of 256 with their integer sub-block scales,
laid out for the CPU matmuls' integer arithmetic. F16 and BF16 are widened to
float32.

Device bytes per weight against the file's: Q4_K 0.5625, Q6_K 0.82, Q5_0 0.69
(the file's; Q5_0 in rows of a multiple of 128, else 1.0), Q4_0/Q4_1 0.75 (file
0.56-0.63), Q5_1/Q5_K 1.0 (0.69-0.75), Q8_0 1.125 (1.06), Q2_K 0.34 (0.33), Q3_K
0.5 (0.43); a matrix stacking different kinds is q8_0 (1.125) or q8x2 (1.5).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import gguf
import numpy as np
import pyopencl as cl

from gpu.model import quants
from gpu.model.load import Model, WeightTensor
from runtime.errors import UnsupportedModelError

Q = gguf.GGMLQuantizationType
# `compact` below: which of the compact types (COMPACT) keep their file's bytes; True is all
Compact = bool | Collection[Q]


@dataclass
class DeviceMatrix:
    """A [rows, cols] weight matrix on the device: kind is the kernel suffix."""

    kind: str  # "q4_1" | "q5" | "q6" | "q4_k" | "q6_k" | "q5_0" | "q2" | "q3" | "q8_0" | "q8x2" | "f32"
    rows: int
    cols: int
    qs: cl.Buffer
    dm: cl.Buffer
    nbytes: int  # bytes a full pass over the matrix reads on the device
    file_bytes: int = 0  # the same weights' bytes in the GGUF file
    first_row: int = 0  # where its rows start in the stack it is a part of
    parts: list[DeviceMatrix] = field(default_factory=list)  # a split stack's (kind "split"): runs of one type


# Zero bytes after a matrix whose rows end in a short group of blocks (cpu/nibbles.cl's
# nib_groups): its last row reads up to three blocks past its end (q8_0's 32 bytes each;
# their d 16), against zero inputs.
READ_PAST = 128


def _buffer(context: cl.Context, array: np.ndarray, pad: int = 0) -> cl.Buffer:
    array = np.ascontiguousarray(array)
    if pad:
        array = np.concatenate([array.reshape(-1).view(np.uint8), np.zeros(pad, np.uint8)])
    if array.nbytes == 0:
        array = np.zeros(4, np.uint8)
    return cl.Buffer(context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=array)


# ---------------------------------------------------------------------- repacking


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    return np.ascontiguousarray(blocks[:, at : at + 2]).view(np.float16).astype(np.float32)[:, 0]


def _nibbles(q: np.ndarray) -> np.ndarray:
    """(n, 32) values 0..15 -> (n, 16) bytes: byte j = q[j] | q[j + 16] << 4."""
    q = q.astype(np.uint8)
    return q[:, :16] | (q[:, 16:] << 4)


def _bitword(bits: np.ndarray, width: int) -> np.ndarray:
    """(n, 32 // width) fields of `width` bits -> (n,) uint32, field j at bit width * j."""
    shifts = (width * np.arange(bits.shape[1])).astype(np.uint32)
    return (bits.astype(np.uint32) << shifts).sum(axis=1, dtype=np.uint32)


def _dm(*columns: np.ndarray, words: Sequence[np.ndarray] = ()) -> np.ndarray:
    """Scales as float32 columns, then bit-pattern words in the remaining float slots."""
    n = len(columns[0])
    out = np.zeros((n, 4 if len(columns) + len(words) > 2 else len(columns) + len(words)), np.float32)
    for i, c in enumerate(columns):
        out[:, i] = c
    for i, w in enumerate(words):
        out.view(np.uint32)[:, len(columns) + i] = w
    return out


def repack(t: WeightTensor, compact: Compact = False) -> tuple[str, np.ndarray, np.ndarray]:
    """(kind, qs (n_blocks, bytes), dm (n_blocks, k) float32) of one matrix, blocks of 32 in row order."""
    if t.qtype in (Q.F32, Q.F16, Q.BF16):
        return "f32", t.dequantize().reshape(t.rows, t.cols).astype(np.float32), np.zeros(4, np.uint8)
    b = np.asarray(t.raw, np.uint8).reshape(-1, t.block_bytes)
    if t.qtype == Q.Q4_0:
        d = _f16(b, 0)
        return "q4_1", b[:, 2:18], _dm(d, -8 * d)
    if t.qtype == Q.Q4_1:
        return "q4_1", b[:, 4:20], _dm(_f16(b, 0), _f16(b, 2))
    if t.qtype in (COMPACT if compact is True else compact or ()) and t.cols % 128 == 0:  # nibbles.cl reads whole halves of a group
        return COMPACT[t.qtype](b)
    if t.qtype in (Q.Q5_0, Q.Q5_1):
        at = 2 if t.qtype == Q.Q5_0 else 4
        d = _f16(b, 0)
        m = -16 * d if t.qtype == Q.Q5_0 else _f16(b, 2)
        qh = np.ascontiguousarray(b[:, at : at + 4]).view(np.uint32)[:, 0]
        return "q5", b[:, at + 4 : at + 20], _dm(d, m, words=[qh])
    if t.qtype == Q.Q8_0:
        return "q8_0", b[:, 2:34], _dm(_f16(b, 0))
    q, scale, offset = quants.SUBBLOCKS[t.qtype](b)
    q32 = q.reshape(-1, 32)
    if t.qtype == Q.Q4_K:
        return "q4_1", _nibbles(q32), _dm(scale.reshape(-1), offset.reshape(-1))
    if t.qtype == Q.Q5_K:
        q32 = q32.astype(np.uint8)
        return "q5", _nibbles(q32 & 15), _dm(scale.reshape(-1), offset.reshape(-1), words=[_bitword(q32 >> 4, 1)])
    if t.qtype == Q.Q6_K:
        scale = scale.reshape(-1, 2)  # sub-blocks of 16: two per block of 32
        q6 = (q32 + 32).astype(np.uint8)
        high = q6 >> 4
        return "q6", _nibbles(q6 & 15), _dm(scale[:, 0], scale[:, 1],
                                            words=[_bitword(high[:, :16], 2), _bitword(high[:, 16:], 2)])  # fmt: skip
    return _low_bit(t, b)


# Where Q4_K's and Q6_K's blocks lie in their group: blocks 1 and 2 (and 5 and 6) trade
# places, so a 256-bit unpack of qwords (cpu/nibbles.cl's block runs) meets them in order
GROUP_ORDER = [0, 2, 1, 3, 4, 6, 5, 7]


def _q4_k(b: np.ndarray) -> tuple[str, np.ndarray, np.ndarray]:
    """A Q4_K super-block's 144 bytes as 128 of nibbles (quant.cl's order, blocks in
    GROUP_ORDER), then its head: d and dmin, then the 6-bit scales and mins in the same 12
    bytes, reordered so the kernels unpack them with byte masks (quant.cl's q4_k_fields):
    byte j scale j and the top two bits of min j (at 6), then four bytes of the mins' low
    four bits, byte i min i's (bits 0..3) and min i + 4's (4..7)."""
    nibbles = _nibbles(quants.SUBBLOCKS[Q.Q4_K](b)[0].reshape(-1, 32)).reshape(len(b), 8, 16)[:, GROUP_ORDER].reshape(len(b), 128)
    s = b[:, 4:16]
    scale = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    mins = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    head = np.concatenate([b[:, 0:4], scale | ((mins >> 4) << 6), (mins[:, :4] & 15) | ((mins[:, 4:] & 15) << 4)], axis=1)
    return "q4_k", np.concatenate([nibbles, head], axis=1).astype(np.uint8), np.zeros(0, np.uint8)


def _q6_k(b: np.ndarray) -> tuple[str, np.ndarray, np.ndarray]:
    """A Q6_K super-block's 210 bytes as 128 of nibbles (blocks in GROUP_ORDER), 64 of high
    bits, the 16 int8 scales, and its f16 d in dm. Each nibble byte's two weights have four
    high bits (the low nibble's two, then the high nibble's): each half group's 64 nibble
    bytes have 32 bytes of them, byte j those of nibble bytes j (low four bits) and j + 32
    (high four), so a byte's bits meet their nibbles with whole-byte masks and shifts."""
    q6 = (quants.SUBBLOCKS[Q.Q6_K](b)[0].reshape(-1, 32) + 32).astype(np.uint8)
    high = q6 >> 4
    fours = (high[:, :16] | (high[:, 16:] << 2)).reshape(len(b), 8, 16)[:, GROUP_ORDER].reshape(len(b), 2, 64)
    high_bytes = (fours[:, :, :32] | (fours[:, :, 32:] << 4)).reshape(len(b), 64)
    nibbles = _nibbles(q6 & 15).reshape(len(b), 8, 16)[:, GROUP_ORDER].reshape(len(b), 128)
    return "q6_k", np.concatenate([nibbles, high_bytes, b[:, 192:208]], axis=1), np.ascontiguousarray(b[:, 208:210])


def _q5_0(b: np.ndarray) -> tuple[str, np.ndarray, np.ndarray]:
    """Q5_0 blocks in groups of 8 (the last padded with zero blocks), 176 bytes each: the
    8 blocks' nibbles, their 8 words of fifth bits, their 8 f16 scales."""
    b = np.concatenate([b, np.zeros((-len(b) % 8, b.shape[1]), np.uint8)])
    groups = len(b) // 8
    nibbles = b[:, 6:22].reshape(groups, 128)
    return "q5_0", np.concatenate([nibbles, b[:, 2:6].reshape(groups, 32), b[:, 0:2].reshape(groups, 16)], axis=1), np.zeros(0, np.uint8)


# Types the device keeps in their file's bytes, moved (kernels/quant.cl: the compact kinds)
COMPACT = {Q.Q4_K: _q4_k, Q.Q6_K: _q6_k, Q.Q5_0: _q5_0}
# The kinds whose groups go in row pairs (quant.cl's paired_group)
PAIRED = ("q4_k", "q6_k")


def _pair_rows(groups: np.ndarray, rows: int) -> np.ndarray:
    """A matrix's groups, `rows` rows' worth in row order, with each row pair's side by
    side: row 2i's group j, then row 2i + 1's. A last odd row's partner is zeros, never
    read: the kernels pair that row with itself."""
    if groups.size == 0:
        return groups
    g = groups.reshape(rows, -1, groups.shape[-1])
    if rows % 2:
        g = np.concatenate([g, np.zeros_like(g[:1])])
    return g.reshape(-1, 2, *g.shape[1:]).transpose(0, 2, 1, 3).reshape(-1, groups.shape[-1])


def _lanes(values: np.ndarray, bits: int) -> np.ndarray:
    """(n, 256) fields of `bits` bits -> (n, 32) uint16 lanes, lane 2u + e holding weights
    16 u + 2 f + e at bits `bits` * f, f = 0..7: sub-block u's even then odd weights."""
    v = values.astype(np.uint16).reshape(len(values), 16, 8, 2).transpose(0, 1, 3, 2)
    return (v << (bits * np.arange(8, dtype=np.uint16))).sum(axis=-1, dtype=np.uint16).reshape(len(values), 32)


def _low_bit(t: WeightTensor, b: np.ndarray) -> tuple[str, np.ndarray, np.ndarray]:
    """Q2_K and Q3_K as q2 and q3, whole super-blocks of 256: 64 bytes of 2-bit quants as 32
    16-bit lanes (lane 2u + e: sub-block u's even (e = 0) or odd weights), beside a record of
    the integer sub-block scales and the super-block's scale(s) as float32. 0.34 B/weight for
    q2, 0.5 for q3, whose third bits (1/8 B/weight) ride in its record, a byte a lane."""
    rec = np.zeros((len(b), 6 if t.qtype == Q.Q2_K else 16), np.float32)
    raw = rec.view(np.uint8)
    if t.qtype == Q.Q2_K:  # record: 16 scale bytes (scale | min << 4), d, dmin
        raw[:, 0:16] = b[:, 0:16]
        rec[:, 4], rec[:, 5] = _f16(b, 80), _f16(b, 82)
        return "q2", _lanes(quants._twobit(b[:, 16:80]), 2).view(np.uint8), rec
    # record: the third bits (bit f of byte 2u + e: weight 16 u + 2 f + e), the 16 six-bit
    # scales less 32 as int8, d
    q, sc = quants.q3_k_fields(b)
    raw[:, 0:32] = _lanes(q >> 2, 1).astype(np.uint8)
    raw[:, 32:48] = (sc.astype(np.int16) - 32).astype(np.int8).view(np.uint8)
    rec[:, 12] = _f16(b, 108)
    return "q3", _lanes(q & 3, 2).view(np.uint8), rec


def levels(t: WeightTensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Any block type as int8 levels (n_blocks, 32) with a (scale, offset) per 16 weights,
    (n_blocks, 2) each: w = scale * q + offset. Exact for every quantized type."""
    b = np.asarray(t.raw, np.uint8).reshape(-1, t.block_bytes)
    if t.qtype in quants.SUBBLOCKS:
        q, scale, offset = quants.SUBBLOCKS[t.qtype](b)  # Q6_K's q comes centred (q - 32)
        if scale.shape[1] == 8:  # 32-wide sub-blocks: the same scale for both halves
            scale, offset = np.repeat(scale, 2, axis=1), np.repeat(offset, 2, axis=1)
        return q.reshape(-1, 32).astype(np.int8), scale.reshape(-1, 2), offset.reshape(-1, 2)
    d = _f16(b, 0)
    if t.qtype == Q.Q8_0:
        q, m = b[:, 2:34].view(np.int8), np.zeros_like(d)
    elif t.qtype in (Q.Q4_0, Q.Q4_1):
        q = quants._nibbles(b[:, 2:18] if t.qtype == Q.Q4_0 else b[:, 4:20]).astype(np.int16)
        q, m = (q - 8, np.zeros_like(d)) if t.qtype == Q.Q4_0 else (q, _f16(b, 2))
    else:  # Q5_0, Q5_1
        q = quants.q5_quants(b, 2 if t.qtype == Q.Q5_0 else 4).astype(np.int16)
        q, m = (q - 16, np.zeros_like(d)) if t.qtype == Q.Q5_0 else (q, _f16(b, 2))
    pair = lambda v: np.repeat(v[:, None], 2, axis=1)  # noqa: E731
    return q.astype(np.int8), pair(d), pair(m)


SYMMETRIC_32 = (Q.Q4_0, Q.Q5_0, Q.Q8_0)


def pack(tensors: Sequence[WeightTensor], compact: Compact = False) -> tuple[str, np.ndarray, np.ndarray]:
    """Stack the rows of `tensors` into one matrix and split it into (kind, qs, dm). Tensors
    of different device kinds (Qwen2.5 stores Q and K as Q5_0, V as Q8_0) meet in the
    narrowest kind that holds them all exactly: q8_0, else q8x2, else float32."""
    cols = tensors[0].cols
    if any(t.cols != cols for t in tensors):
        raise UnsupportedModelError(f"cannot stack {[t.name for t in tensors]}: different widths")
    if cols % 32:
        raise UnsupportedModelError(f"{tensors[0].name}: width {cols} is not a multiple of 32")
    if len({t.qtype for t in tensors}) == 1:  # one run of blocks: a compact kind's groups span them
        t = tensors[0]
        return repack(WeightTensor(t.name, t.qtype, sum(t.rows for t in tensors), cols, np.concatenate([t.raw for t in tensors])), compact)
    parts = [repack(t, compact) for t in tensors]
    kinds = {kind for kind, _, _ in parts}
    if len(kinds) == 1:
        kind = kinds.pop()
        if len(parts) == 1:
            return parts[0]
        return kind, np.concatenate([qs for _, qs, _ in parts]), np.concatenate([dm for _, _, dm in parts])
    if "f32" in kinds:
        dense = np.concatenate([t.dequantize().reshape(t.rows, t.cols) for t in tensors])
        return "f32", dense.astype(np.float32), np.zeros(4, np.uint8)
    q, scale, offset = (np.concatenate(x) for x in zip(*(levels(t) for t in tensors), strict=False))
    if all(t.qtype in SYMMETRIC_32 for t in tensors):
        return "q8_0", q, _dm(scale[:, 0])
    return "q8x2", q, _dm(scale[:, 0], offset[:, 0], scale[:, 1], offset[:, 1])


def upload_matrix(context: cl.Context, tensors: Sequence[WeightTensor], compact: Compact = False) -> DeviceMatrix:
    """`tensors` stacked by rows as one matrix; with `compact`, Q4_K, Q6_K and Q5_0 (or the
    ones it names) in the compact kinds (the file's bytes)."""
    kind, qs, dm = pack(tensors, compact)
    rows = sum(t.rows for t in tensors)
    nbytes = qs.nbytes + (dm.nbytes if kind != "f32" else 0)
    file_bytes = sum(t.raw.nbytes for t in tensors)
    if kind in PAIRED:
        qs, dm = _pair_rows(qs, rows), _pair_rows(dm, rows)
    pad = READ_PAST if tensors[0].cols % 128 else 0
    return DeviceMatrix(kind, rows, tensors[0].cols, _buffer(context, qs, pad), _buffer(context, dm, pad), nbytes, file_bytes)


def upload_stack(context: cl.Context, tensors: Sequence[WeightTensor], split: bool, compact: Compact = False) -> DeviceMatrix:
    """Tensors stacked by rows. With `split`, tensors of different types (Qwen2.5's Q and K
    in Q4_K, V in Q6_K) stay apart, each run of one type a part in its own kind (compact
    where that kind is), read by a launch of its own from its first row: a step then reads
    their file's bytes, where `pack` would widen them all to one kind that holds every
    type (q8x2: 1.5 B/weight). A part starts on an even row, so no row pair straddles two."""
    runs: list[list[WeightTensor]] = []
    for t in tensors:
        if runs and runs[-1][0].qtype == t.qtype:
            runs[-1].append(t)
        else:
            runs.append([t])
    starts = np.cumsum([0] + [sum(t.rows for t in run) for run in runs])
    if not split or len(runs) == 1 or any(start % 2 for start in starts):
        return upload_matrix(context, tensors, compact)
    parts = [upload_matrix(context, run, compact) for run in runs]
    for part, start in zip(parts, starts, strict=False):
        part.first_row = int(start)
    none = _buffer(context, np.zeros(0, np.uint8))
    return DeviceMatrix("split", int(starts[-1]), tensors[0].cols, none, none, sum(m.nbytes for m in parts),
                        sum(m.file_bytes for m in parts), parts=parts)  # fmt: skip


def upload_vector(context: cl.Context, tensor: WeightTensor) -> cl.Buffer:
    return _buffer(context, tensor.dequantize().reshape(-1).astype(np.float32))


@dataclass
class LayerWeights:
    attn_norm: cl.Buffer
    qkv: DeviceMatrix  # q rows, then k rows, then v rows
    rope: cl.Buffer  # HEAD_DIM/2 RoPE frequencies, the QKV bias (zeros when none), then `rope_table`
    out: DeviceMatrix
    ffn_norm: cl.Buffer
    gate_up: DeviceMatrix  # gate rows, then up rows
    down: DeviceMatrix
    q_norm: cl.Buffer | None = None  # per-head RMSNorm weights (qk_norm)
    k_norm: cl.Buffer | None = None
    post_attn_norm: cl.Buffer | None = None  # post_norms
    post_ffw_norm: cl.Buffer | None = None


@dataclass
class ModelWeights:
    embed: DeviceMatrix
    layers: list[LayerWeights]
    output_norm: cl.Buffer
    output: DeviceMatrix
    rope_positions: int  # positions of each layer's RoPE table (rope_table)

    def matrices(self) -> list[DeviceMatrix]:
        """Every matrix one step reads: the layers' and the output head."""
        return [m for L in self.layers for m in (L.qkv, L.out, L.gate_up, L.down)] + [self.output]

    def bytes_per_step(self) -> int:
        """Weight bytes one step reads on the device (every layer matrix and the output head)."""
        return sum(m.nbytes for m in self.matrices())

    def file_bytes_per_step(self) -> int:
        """The same weights' bytes in the GGUF file."""
        return sum(m.file_bytes for m in self.matrices())


def neox_to_adjacent(t: WeightTensor, head_dim: int) -> WeightTensor:
    """Reorder each head's rows (or entries) so NEOX RoPE's pairs (i, i + head_dim/2) become
    adjacent (2i, 2i+1). Applied to Q and K alike it leaves every q.k, so attention, unchanged,
    and the kernels need only one RoPE. Whole quantized rows move, so it is exact."""
    half = head_dim // 2
    within = np.stack([np.arange(half), np.arange(half) + half], axis=1).reshape(-1)
    if t.is_vector:
        order = (np.arange(t.cols // head_dim)[:, None] * head_dim + within).reshape(-1)
        return WeightTensor(t.name, t.qtype, 1, t.cols, np.ascontiguousarray(t.raw[:, order]))
    order = (np.arange(t.rows // head_dim)[:, None] * head_dim + within).reshape(-1)
    return WeightTensor(t.name, t.qtype, t.rows, t.cols, np.ascontiguousarray(t.raw[order]))


ROPE_TABLE_POSITIONS = 1024  # positions whose RoPE angles a layer's constants carry


def rope_table(inv_freq: np.ndarray, positions: int) -> np.ndarray:
    """(cos, sin) of pos * inv_freq[i] at [pos][i] for pos < positions, flat float32 pairs,
    which common.cl's rotate_pair reads instead of computing: PoCL's sincos took a quarter
    of the QKV matmul's time at batch 1 (256 KB a layer for SmolLM2). Each is of the float32
    angle the kernel would form (pos times the float32 frequency), correctly rounded."""
    angle = np.arange(positions, dtype=np.float32)[:, None] * inv_freq.astype(np.float32)[None, :]
    return np.stack([np.cos(angle.astype(np.float64)), np.sin(angle.astype(np.float64))], axis=-1).astype(np.float32).ravel()


def upload_weights(context: cl.Context, model: Model, split_stacks: bool = False, compact: Compact = False) -> ModelWeights:
    """Every tensor of a `gpu.model.load.Model`, packed and on the device, as its architecture
    asks; with `split_stacks`, a QKV stack of different types in parts (upload_stack); with
    `compact`, Q4_K, Q6_K and Q5_0 in the compact kinds."""
    c, arch = model.config, model.config.arch
    if arch.rope == "neox":
        fix = lambda t: neox_to_adjacent(t, c.head_dim)  # noqa: E731
    else:
        fix = lambda t: t  # noqa: E731
    vector = lambda t: upload_vector(context, t)  # noqa: E731
    positions = min(ROPE_TABLE_POSITIONS, c.context_length)
    layers = []
    for i in range(c.n_layers):
        t = lambda name, i=i: model.tensor(f"blk.{i}.{name}")  # noqa: E731
        if arch.qkv_bias:
            bias = np.concatenate([fix(t("attn_q.bias")).dequantize(), fix(t("attn_k.bias")).dequantize(),
                                   t("attn_v.bias").dequantize()])  # fmt: skip
        else:
            bias = np.zeros(c.q_dim + 2 * c.kv_dim, np.float32)
        L = LayerWeights(
            attn_norm=vector(t("attn_norm.weight")),
            qkv=upload_stack(context, [fix(t("attn_q.weight")), fix(t("attn_k.weight")), t("attn_v.weight")], split_stacks, compact),
            rope=_buffer(
                context, np.concatenate([c.inv_freq(i).astype(np.float32), bias.astype(np.float32), rope_table(c.inv_freq(i), positions)])
            ),
            out=upload_matrix(context, [t("attn_output.weight")], compact),
            ffn_norm=vector(t("ffn_norm.weight")),
            gate_up=upload_matrix(context, [t("ffn_gate.weight"), t("ffn_up.weight")], compact),
            down=upload_matrix(context, [t("ffn_down.weight")], compact),
        )
        if arch.qk_norm:
            L.q_norm, L.k_norm = vector(fix(t("attn_q_norm.weight"))), vector(fix(t("attn_k_norm.weight")))
        if arch.post_norms:
            L.post_attn_norm, L.post_ffw_norm = vector(t("post_attention_norm.weight")), vector(t("post_ffw_norm.weight"))
        layers.append(L)
    embed = upload_matrix(context, [model.tensor("token_embd.weight")], compact)
    output = embed if model.tied else upload_matrix(context, [model.output_weight()], compact)
    return ModelWeights(embed, layers, vector(model.tensor("output_norm.weight")), output, positions)
