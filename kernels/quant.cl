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
 *   Q2    whole super-blocks of 256 (8 blocks of 32), from Q2_K:
 *         qs = 64 B of 2-bit quants as 32 16-bit lanes: lane 2u + e holds weights
 *         16 u + 2 f + e at bits 2 f, f = 0..7 (sub-block u's even, then odd weights)
 *         dm = 6 floats: 16 scale bytes (scale | min << 4, one per 16 weights), d, dmin
 *         w = d scale q - dmin min
 *   Q3    from Q3_K, the same 64 B of low quant bits, and dm = 16 floats: 32 B of
 *         third bits (bit f of byte 2u + e, as the lanes above), 16 scales less 32
 *         as int8, d:   w = d scale (q - 4)
 *   Q8_0  qs = 32 int8        dm = float d                   w = d q
 *   Q8X2  qs = 32 int8        dm = float4 (d0, m0, d1, m1)   w = d q + m per half
 *         the common kind when one matrix stacks tensors of different kinds
 *   F32   qs = the float row itself, dm unused (from F32, F16, BF16)
 * qh words are bit patterns carried in float slots (as_uint reads them back).
 * `load_block` returns the 32 weights of block `blk` as lo (0..15), hi (16..31).
 * (q2 and q3 too, here; the CPU matmuls read them a super-block at a time, in
 * cpu/lowbit.cl.) The scales are widened from f16 to f32 on upload (4 more bytes
 * per Q4_1 block, 20%): without cl_khr_fp16 each half took ~20 scalar
 * instructions to convert and the Q4_1 matmul was compute-bound at a quarter of
 * the memory bandwidth.
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
 * packing in gpu/weights.py. Nothing in cpu/ or gpu/ changes. The CPU family's
 * matmuls read the super-block kinds (q2, q3) in integer arithmetic
 * (cpu/lowbit.cl) and decode the others to floats, a block at a time. */
#define FOR_EACH_BLOCK_WTYPE(X) X(q4_1, WT_Q4_1) X(q8_0, WT_Q8_0) X(f32, WT_F32) \
    X(q5, WT_Q5) X(q6, WT_Q6) X(q8x2, WT_Q8X2)
#define FOR_EACH_SUPER_WTYPE(X) X(q2, WT_Q2) X(q3, WT_Q3)
#define FOR_EACH_WTYPE(X) FOR_EACH_BLOCK_WTYPE(X) FOR_EACH_SUPER_WTYPE(X)

#define LANES (uint16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)

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
    } else if (wtype == WT_Q2 || wtype == WT_Q3) {
        /* block b of its super-block is sub-blocks 2b, 2b + 1: lanes 4b..4b + 3, 8 bytes */
        const size_t sb = blk / 8;
        const uint b = blk % 8;
        const uint2 w = ((__global const uint2 *)qs)[blk];
        const uint16 odd = LANES & 1u, f = LANES >> 1;
        uint16 q0 = ((uint16)(w.x) >> (16u * odd + 2u * f)) & 3u, q1 = ((uint16)(w.y) >> (16u * odd + 2u * f)) & 3u;
        if (wtype == WT_Q2) {
            __global const float *rec = dm + 6 * sb;
            const uint s0 = ((__global const uchar *)rec)[2 * b], s1 = ((__global const uchar *)rec)[2 * b + 1];
            *lo = convert_float16(q0) * (rec[4] * (float)(s0 & 15u)) - rec[5] * (float)(s0 >> 4);
            *hi = convert_float16(q1) * (rec[4] * (float)(s1 & 15u)) - rec[5] * (float)(s1 >> 4);
        } else {
            __global const float *rec = dm + 16 * sb;
            const uint h = ((__global const uint *)rec)[b];
            __global const char *sc = (__global const char *)rec + 32;
            q0 |= (((uint16)(h) >> (8u * odd + f)) & 1u) << 2;
            q1 |= (((uint16)(h) >> (16u + 8u * odd + f)) & 1u) << 2;
            *lo = (convert_float16(q0) - 4.0f) * (rec[12] * sc[2 * b]);
            *hi = (convert_float16(q1) - 4.0f) * (rec[12] * sc[2 * b + 1]);
        }
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
