"""GGUF tensor types, dequantized to float32 with vectorised NumPy: the reference's reading of
every weight format, and the device packer's (gpu/weights.py) source of scales and quants.

    w = dequantize(raw, Q.Q4_K)     # raw: uint8 (..., bytes), whole blocks per row -> float32

A type is a run of blocks along each row (ggml's block_* structs, little-endian):

    Q4_0  32 w   f16 d, 16 B nibbles                   w = d (q - 8)
    Q4_1  32 w   f16 d, f16 m, 16 B nibbles            w = d q + m
    Q5_0  32 w   f16 d, u32 high bits, 16 B nibbles    w = d (q - 16)
    Q5_1  32 w   f16 d, f16 m, u32 high bits, nibbles  w = d q + m
    Q8_0  32 w   f16 d, 32 int8                        w = d q
    Q2_K  256 w  16 B scales|mins (4+4 bit), 64 B 2-bit quants, f16 d, f16 dmin
    Q3_K  256 w  32 B high-bit mask, 64 B 2-bit quants, 12 B 6-bit scales, f16 d
    Q4_K  256 w  f16 d, f16 dmin, 12 B 6-bit scales|mins, 128 B nibbles
    Q5_K  256 w  f16 d, f16 dmin, 12 B scales|mins, 32 B high bits, 128 B nibbles
    Q6_K  256 w  128 B low nibbles, 64 B high 2-bit pairs, 16 int8 scales, f16 d
    BF16, F16, F32: one value per weight

In the nibble types, byte j of a 32-weight block holds weight j (low nibble) and j + 16 (high).
The K-quants' sub-block structure is written out in `subblocks_*`, which the device packer reuses.
"""

from __future__ import annotations

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The f16 at byte `start` of each block, as float32 (n, 1)."""
    return np.ascontiguousarray(blocks[:, start : start + 2]).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 16k) bytes -> (n, 32k) values: each 16-byte group gives its 16 low nibbles, then its 16 high."""
    n, width = qs.shape
    g = qs.reshape(n, width // 16, 1, 16)
    return np.concatenate([g & 0x0F, g >> 4], axis=2).reshape(n, 2 * width)


def _bits(packed: np.ndarray) -> np.ndarray:
    """(n, k) bytes -> (n, 8k) bits, least significant bit first."""
    return np.unpackbits(packed, axis=1, bitorder="little")


# ---------------------------------------------------------------------- 32-weight blocks


def q4_0(b: np.ndarray) -> np.ndarray:
    return _f16(b, 0) * (_nibbles(b[:, 2:18]).astype(np.float32) - 8)


def q4_1(b: np.ndarray) -> np.ndarray:
    return _f16(b, 0) * _nibbles(b[:, 4:20]) + _f16(b, 2)


def q5_quants(b: np.ndarray, offset: int) -> np.ndarray:
    """The 5-bit quants 0..31 of Q5_0 (offset 2) or Q5_1 (offset 4) blocks."""
    high = _bits(b[:, offset : offset + 4])  # bit j is weight j's fifth bit
    return _nibbles(b[:, offset + 4 : offset + 20]) | (high << 4)


def q5_0(b: np.ndarray) -> np.ndarray:
    return _f16(b, 0) * (q5_quants(b, 2).astype(np.float32) - 16)


def q5_1(b: np.ndarray) -> np.ndarray:
    return _f16(b, 0) * q5_quants(b, 4) + _f16(b, 2)


def q8_0(b: np.ndarray) -> np.ndarray:
    return _f16(b, 0) * b[:, 2:34].view(np.int8)


# ---------------------------------------------------------------------- K-quants (256 weights)
# Each subblocks_* returns (quants, scale, offset) with quants (n, 256) and scale/offset
# (n, sub-blocks): weight i of sub-block s is scale[s] * quants[i] + offset[s].


def _scale_min_k4(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes -> 8 six-bit scales and 8 six-bit mins (ggml get_scale_min_k4)."""
    p = packed.astype(np.uint8)
    sc = np.empty((len(p), 8), np.uint8)
    mn = np.empty((len(p), 8), np.uint8)
    sc[:, :4], mn[:, :4] = p[:, 0:4] & 63, p[:, 4:8] & 63
    sc[:, 4:] = (p[:, 8:12] & 0x0F) | ((p[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (p[:, 8:12] >> 4) | ((p[:, 4:8] >> 6) << 4)
    return sc.astype(np.float32), mn.astype(np.float32)


def _pairs32(qs: np.ndarray) -> np.ndarray:
    """128 bytes of Q4_K nibbles -> 256 values: per 32-byte group, 32 low nibbles then 32 high."""
    g = qs.reshape(len(qs), 4, 1, 32)
    return np.concatenate([g & 0x0F, g >> 4], axis=2).reshape(len(qs), 256)


def subblocks_q4_k(b: np.ndarray):
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, mn = _scale_min_k4(b[:, 4:16])
    return _pairs32(b[:, 16:144]), d * sc, -dmin * mn  # 8 sub-blocks of 32


def subblocks_q5_k(b: np.ndarray):
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, mn = _scale_min_k4(b[:, 4:16])
    # qh byte l, bit 2j (bit 2j+1) is the fifth bit of weight l of sub-block 2j (2j+1)
    high = _bits(b[:, 16:48]).reshape(len(b), 32, 8).transpose(0, 2, 1).reshape(len(b), 256)
    return _pairs32(b[:, 48:176]) | (high << 4), d * sc, -dmin * mn


def subblocks_q6_k(b: np.ndarray):
    n = len(b)
    ql, qh = b[:, 0:128].reshape(n, 2, 64), b[:, 128:192].reshape(n, 2, 1, 32)
    low = np.concatenate([ql[:, :, :32] & 0x0F, ql[:, :, 32:] & 0x0F, ql[:, :, :32] >> 4, ql[:, :, 32:] >> 4], axis=2)
    high = (qh >> np.array([0, 2, 4, 6], np.uint8)[None, None, :, None]) & 3  # (n, 2, 4, 32)
    q = (low.reshape(n, 2, 4, 32) | (high << 4)).reshape(n, 256).astype(np.float32) - 32
    scales = b[:, 192:208].view(np.int8).astype(np.float32) * _f16(b, 208)
    return q, scales, np.zeros_like(scales)  # 16 sub-blocks of 16


def _twobit(qs: np.ndarray) -> np.ndarray:
    """64 bytes of 2-bit quants -> 256 values: per 32-byte half, shifts 0, 2, 4, 6 in turn."""
    g = qs.reshape(len(qs), 2, 1, 32)
    return ((g >> np.array([0, 2, 4, 6], np.uint8)[None, None, :, None]) & 3).reshape(len(qs), 256)


def subblocks_q2_k(b: np.ndarray):
    d, dmin = _f16(b, 80), _f16(b, 82)
    scales = b[:, 0:16]
    return _twobit(b[:, 16:80]), d * (scales & 0x0F), -dmin * (scales >> 4)


def q3_k_fields(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q3_K's integers: quants + 4 (n, 256) in 0..7, and 16 six-bit scales + 32 (n, 16)."""
    n = len(b)
    hmask, s = b[:, 0:32], b[:, 96:108]
    i = np.arange(16)
    low = np.where(i < 8, s[:, i % 8] & 0x0F, s[:, i % 8] >> 4)
    high = (s[:, 8 + i % 4] >> (2 * (i // 4)).astype(np.uint8)) & 3
    # weight l of the group with shift index j (0..7) takes bit j of hmask[l]; a clear bit subtracts 4
    hbit = _bits(hmask).reshape(n, 32, 8).transpose(0, 2, 1).reshape(n, 256)
    return _twobit(b[:, 32:96]) | (hbit << 2), low | (high << 4)


def subblocks_q3_k(b: np.ndarray):
    q, scales = q3_k_fields(b)
    scales = _f16(b, 108) * (scales.astype(np.float32) - 32)
    return q.astype(np.float32) - 4, scales, np.zeros_like(scales)


SUBBLOCKS = {
    Q.Q2_K: subblocks_q2_k,
    Q.Q3_K: subblocks_q3_k,
    Q.Q4_K: subblocks_q4_k,
    Q.Q5_K: subblocks_q5_k,
    Q.Q6_K: subblocks_q6_k,
}


def _k_quant(kind: Q):
    def dequantize_blocks(b: np.ndarray) -> np.ndarray:
        q, scale, offset = SUBBLOCKS[kind](b)
        sub = scale.shape[1]
        q = q.reshape(len(b), sub, 256 // sub)
        return (q * scale[:, :, None] + offset[:, :, None]).reshape(len(b), 256)

    return dequantize_blocks


def bf16(b: np.ndarray) -> np.ndarray:
    return (np.ascontiguousarray(b).view(np.uint16).astype(np.uint32) << 16).view(np.float32)


BLOCK_DEQUANTIZERS = {
    Q.Q4_0: q4_0,
    Q.Q4_1: q4_1,
    Q.Q5_0: q5_0,
    Q.Q5_1: q5_1,
    Q.Q8_0: q8_0,
    Q.BF16: bf16,
    **{kind: _k_quant(kind) for kind in SUBBLOCKS},
}

# Every type the reference and the kernels read.
SUPPORTED_TYPES: frozenset[Q] = frozenset({*BLOCK_DEQUANTIZERS, Q.F16, Q.F32})


def dequantize(raw: np.ndarray, qtype: Q) -> np.ndarray:
    """float32 weights of `raw`, whose last axis is a whole number of `qtype` blocks."""
    if qtype == Q.F32:
        return np.asarray(raw, np.float32)
    if qtype == Q.F16:
        return np.asarray(raw, np.float16).astype(np.float32)
    block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    data = np.ascontiguousarray(raw, dtype=np.uint8)
    lead = data.shape[:-1]
    blocks = data.reshape(-1, block_bytes)
    out = BLOCK_DEQUANTIZERS[qtype](blocks).astype(np.float32, copy=False)
    return out.reshape(*lead, data.shape[-1] // block_bytes * block)
