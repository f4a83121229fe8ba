/* Quantized weight blocks, shared by every kernel that reads weights.
 *
 * Weights stay quantized on the device in blocks of 32 along a row. The host
 * (gpu/weights.py) repacks each GGUF type into one of these device kinds, two
 * arrays so vector loads are aligned; in every nibble kind byte j of a block's
 * qs holds weight j (low nibble) and weight j + 16 (high):
 *   Q4_1  qs = 16 B nibbles   dm = float2 (d, m)           w = d q + m
 *         from Q4_0 (m = -8d), Q4_1, Q4_K (d, m of each 32-weight sub-block)
 *   Q5    qs = 16 B nibbles   dm = float4 (d, m, qh, -)    w = d (q + 16 bit_j(qh)) + m
 *         from Q5_0 (m = -16d), Q5_1, Q5_K
 *   Q6    qs = 16 B nibbles   dm = float4 (d0, d1, qh0, qh1)
 *         q = nibble + 16 * (2-bit pair j of qh0|qh1), w = d0|d1 (q - 32)
 *         from Q6_K (d0 scales weights 0..15, d1 16..31: its sub-blocks of 16)
 *   Q2    qs = uint4 (q0, q1, d | dmin << 16, sc0 | sc1 << 8)   dm unused
 *         from Q2_K: q0, q1 the 2-bit quants of weights 0..15, 16..31; d, dmin the
 *         super-block's f16 bits; sc the sub-blocks' scale bytes (scale | min << 4):
 *         w = d scale q - dmin min in each half
 *   Q3    qs = uint4 (q0, q1, hq, d | sc0 << 16 | sc1 << 22)          dm unused
 *         from Q3_K: q = the 2-bit quant | bit j of hq << 2, sc six bits:
 *         w = d (sc - 32)(q - 4) in each half
 *   Q8_0  qs = 32 int8        dm = float d                   w = d q
 *   Q8X2  qs = 32 int8        dm = float4 (d0, m0, d1, m1)   w = d q + m per half
 *         the common kind when one matrix stacks tensors of different kinds
 *   F32   qs = the float row itself, dm unused (from F32, F16, BF16)
 * qh words are bit patterns carried in float slots (as_uint reads them back).
 * `load_block` returns the 32 weights of block `blk` as lo (0..15), hi (16..31).
 * The scales are widened from f16 to f32 on upload (4 more bytes per Q4_1 block,
 * 20%): without cl_khr_fp16 each half took ~20 scalar instructions to convert
 * and the Q4_1 matmul was compute-bound at a quarter of the memory bandwidth.
 * `wtype` is a literal at every call site, so the branches fold away.
 *
 * Vector loads are plain dereferences of aligned vector pointers (every offset
 * below is a multiple of 16 elements): PoCL does not inline vloadN/vload_half,
 * and a function call per load made the matmuls several times slower.
 */
/* F16(i, p): the i-th float16 at p, like vload16(i, p) */
#define F16(i, p) (((__global const float16 *)(p))[i])

#define WT_Q4_1 0
#define WT_Q8_0 1
#define WT_F32 2
#define WT_Q5 3
#define WT_Q6 4
#define WT_Q2 5
#define WT_Q8X2 6
#define WT_Q3 7
#define WT_Q8_LEVELS 8  /* Q8_0 without its scale: w / d, for a dot product to scale once */

/* Every weight type the kernels read, as X(kernel suffix, WT_ constant). Each
 * kernel family instantiates its weight-reading kernels once per entry, so a new
 * type is: a WT_ constant, its branch in load_block, its entry here, and its
 * packing in gpu/weights.py. Nothing in cpu/ or gpu/ changes. */
#define FOR_EACH_WTYPE(X) X(q4_1, WT_Q4_1) X(q8_0, WT_Q8_0) X(f32, WT_F32) \
    X(q5, WT_Q5) X(q6, WT_Q6) X(q2, WT_Q2) X(q3, WT_Q3) X(q8x2, WT_Q8X2)

#define LANES (uint16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)

/* The value of an f16's bits, without cl_khr_fp16: exponent and mantissa moved to a
 * float's places read 2^112 too small, and the multiply is exact. Right for normal
 * values and zero; gpu/weights.py packs tensors with other scales another way. */
inline float f16_bits(uint h)
{
    return as_float(as_uint(as_float((h & 0x7fffu) << 13) * 0x1p112f) | ((h & 0x8000u) << 16));
}

/* Sixteen 2-bit fields of w, field j at bits 2j */
#define TWO_BITS(w) convert_float16(((uint16)(w) >> (2u * LANES)) & 3u)

__attribute__((always_inline)) inline void load_block(const int wtype, __global const uchar *qs,
                       __global const float *dm, size_t blk,
                       float16 *lo, float16 *hi)
{
    if (wtype == WT_Q4_1) {
        const uchar16 q = ((__global const uchar16 *)qs)[blk];
        const float2 s = ((__global const float2 *)dm)[blk];
        *lo = convert_float16(q & (uchar)15) * s.x + s.y;
        *hi = convert_float16(q >> (uchar)4) * s.x + s.y;
    } else if (wtype == WT_Q5) {
        const uchar16 q = ((__global const uchar16 *)qs)[blk];
        const float4 s = ((__global const float4 *)dm)[blk];
        const uint16 qh = (uint16)(as_uint(s.z));
        *lo = convert_float16(convert_uint16(q & (uchar)15) | (((qh >> LANES) & 1u) << 4)) * s.x + s.y;
        *hi = convert_float16(convert_uint16(q >> (uchar)4) | (((qh >> (LANES + 16u)) & 1u) << 4)) * s.x + s.y;
    } else if (wtype == WT_Q6) {
        const uchar16 q = ((__global const uchar16 *)qs)[blk];
        const float4 s = ((__global const float4 *)dm)[blk];
        const uint16 h0 = (uint16)(as_uint(s.z)), h1 = (uint16)(as_uint(s.w));
        *lo = (convert_float16(convert_uint16(q & (uchar)15) | (((h0 >> (2u * LANES)) & 3u) << 4)) - 32.0f) * s.x;
        *hi = (convert_float16(convert_uint16(q >> (uchar)4) | (((h1 >> (2u * LANES)) & 3u) << 4)) - 32.0f) * s.y;
    } else if (wtype == WT_Q2) {
        const uint4 w = ((__global const uint4 *)qs)[blk];
        const float d = f16_bits(w.z & 0xffffu), dmin = f16_bits(w.z >> 16);
        *lo = TWO_BITS(w.x) * (d * (float)(w.w & 15u)) - dmin * (float)((w.w >> 4) & 15u);
        *hi = TWO_BITS(w.y) * (d * (float)((w.w >> 8) & 15u)) - dmin * (float)((w.w >> 12) & 15u);
    } else if (wtype == WT_Q3) {
        const uint4 w = ((__global const uint4 *)qs)[blk];
        const float d = f16_bits(w.w & 0xffffu);
        const uint16 h = (uint16)(w.z);
        const float s0 = d * (float)((int)((w.w >> 16) & 63u) - 32), s1 = d * (float)((int)(w.w >> 22) - 32);
        *lo = convert_float16((((uint16)(w.x) >> (2u * LANES)) & 3u) | (((h >> LANES) << 2) & 4u)) * s0 - 4.0f * s0;
        *hi = convert_float16((((uint16)(w.y) >> (2u * LANES)) & 3u) | (((h >> (LANES + 16u)) << 2) & 4u)) * s1 - 4.0f * s1;
    } else if (wtype == WT_Q8X2) {
        __global const char16 *q = (__global const char16 *)qs;
        const float4 s = ((__global const float4 *)dm)[blk];
        *lo = convert_float16(q[2 * blk]) * s.x + s.y;
        *hi = convert_float16(q[2 * blk + 1]) * s.z + s.w;
    } else if (wtype == WT_Q8_0 || wtype == WT_Q8_LEVELS) {
        __global const char16 *q = (__global const char16 *)qs;
        const float d = wtype == WT_Q8_0 ? dm[blk] : 1.0f;
        *lo = convert_float16(q[2 * blk]) * d;
        *hi = convert_float16(q[2 * blk + 1]) * d;
    } else {
        *lo = F16(2 * blk, qs);
        *hi = F16(2 * blk + 1, qs);
    }
}

inline float hsum8(float8 v)
{
    float4 b = v.lo + v.hi;
    float2 c = b.lo + b.hi;
    return c.x + c.y;
}

inline float hsum16(float16 v)
{
    return hsum8(v.lo + v.hi);
}
