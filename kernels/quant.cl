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
 * The compact kinds keep the file's bytes (no more), moved so loads stay aligned, in
 * groups of 8 blocks (256 weights: a K-quant super-block); their nibbles are stored as
 * above, 16 B a block, the group's first 128 bytes, and f16 scales are read as bits.
 * Q4_K's and Q6_K's blocks lie in GROUP_SLOT's order, 1 and 2 (5 and 6) trading places:
 * cpu/nibbles.cl's 256-bit unpacks of their qwords then meet the blocks in order.
 *   Q4_K  qs = 144 B a group: nibbles, then a 16-byte head: d, dmin as f16, and the 6-bit
 *         sub-block scales and mins in the file's 12 bytes, reordered (q4_k_fields)
 *         w = d sc_j q - dmin m_j; dm unused
 *   Q6_K  qs = 208 B a group: nibbles, 64 B of high bits (four a nibble byte: its low
 *         nibble's top two bits, then its high nibble's; each half group's 64 nibble bytes
 *         have 32 bytes, byte j those of nibble bytes j and j + 32, in its low and high
 *         four bits), 16 int8 scales (one per 16 weights); dm = the group's d as f16
 *         w = d sc (q - 32)
 *   Q5_0  qs = 176 B a group of 8 blocks of a Q5_0 matrix (flat, across rows): nibbles,
 *         8 words of fifth bits (as Q5's qh), 8 f16 d; dm unused   w = d (q - 16)
 * Q4_K's and Q6_K's groups (and Q6_K's d) go in row pairs: row 2i's group j, then row
 * 2i + 1's (paired_group). A matmul reads two rows at once, and so reads one run of
 * bytes, which the core's prefetcher follows better than two runs a row apart.
 * qh words are bit patterns carried in float slots (as_uint reads them back).
 * `load_block` returns the 32 weights of block `b` of row `row` (`nb` blocks a row) as
 * lo (0..15), hi (16..31).
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
#define WT_Q4_K 9
#define WT_Q6_K 10
#define WT_Q5_0 11

/* bytes of a compact kind's group of 8 blocks in qs */
#define Q4_K_GROUP 144
#define Q6_K_GROUP 208
#define Q5_0_GROUP 176

/* Every weight type the kernels read, as X(kernel suffix, WT_ constant). The GPU
 * family instantiates its weight-reading kernels once per entry, so there a new
 * type is: a WT_ constant, its branch in load_block, its entry here, and its
 * packing in gpu/weights.py. The CPU family's matmuls read most kinds in integer
 * arithmetic (cpu/nibbles.cl; cpu/lowbit.cl the super-block kinds q2 and q3) and
 * decode f32 and q8x2 to floats, a block at a time (cpu/matmul.cl): a new type
 * takes one of those routes as well. */
#define FOR_EACH_BLOCK_WTYPE(X) X(q4_1, WT_Q4_1) X(q8_0, WT_Q8_0) X(f32, WT_F32) \
    X(q5, WT_Q5) X(q6, WT_Q6) X(q8x2, WT_Q8X2) X(q4_k, WT_Q4_K) X(q6_k, WT_Q6_K) X(q5_0, WT_Q5_0)
#define FOR_EACH_SUPER_WTYPE(X) X(q2, WT_Q2) X(q3, WT_Q3)
#define FOR_EACH_WTYPE(X) FOR_EACH_BLOCK_WTYPE(X) FOR_EACH_SUPER_WTYPE(X)

#define LANES (uint16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)

/* f16 bit patterns as floats, exact for every finite value, in integer arithmetic (as
   vload_half would be, which PoCL calls out of line): normal values by moving the
   exponent and mantissa into place, subnormal ones as integer multiples of 2^-24. */
inline float8 halves_to_float8(ushort8 h)
{
#if defined(__F16C__)
    /* one vcvtph2ps where the target has F16C (x86 CPUs), exact as the integer form */
    typedef short v8hi __attribute__((__vector_size__(16)));
    return __builtin_astype(__builtin_ia32_vcvtph2ps256(__builtin_astype(h, v8hi)), float8);
#endif
    const uint8 u = convert_uint8(h), em = u & 0x7fffu;
    const uint8 normal = (em << 13) + 0x38000000u;
    const uint8 subnormal = as_uint8(convert_float8(em) * 0x1p-24f);
    return as_float8(select(normal, subnormal, em < 0x400u) | ((u & 0x8000u) << 16));
}

/* A Q4_K group's 6-bit sub-block scales (lanes 0..7) and mins (8..15) as integers, from
   its 16-byte head as gpu/weights.py lays it out: d, dmin, then byte 4 + j scale j and
   min j's top two bits (at 6), then byte 12 + i min i's low four bits and min i + 4's */
inline int16 q4_k_fields(uint4 head)
{
    const uchar16 b = as_uchar16(head);
    const uchar8 low = (uchar8)(b.scdef & (uchar)15, b.scdef >> (uchar)4);
    return convert_int16((uchar16)(b.s456789ab & (uchar)63, low | ((b.s456789ab >> (uchar)6) << (uchar)4)));
}

/* A Q4_K group's 8 sub-block scales d sc_j and offsets -dmin m_j */
inline void q4_k_scales(uint4 head, float8 *scale, float8 *offset)
{
    const float8 dd = halves_to_float8(as_ushort8(head));
    const float16 fields = convert_float16(q4_k_fields(head));
    *scale = dd.s0 * fields.lo;
    *offset = -(dd.s1 * fields.hi);
}

/* The slot of block j (0..7) of a Q4_K or Q6_K group (gpu/weights.py's GROUP_ORDER) */
#define GROUP_SLOT(j) (((j) & 4) | (((j) & 1) << 1) | (((j) >> 1) & 1))

/* Where row `row`'s group j of a Q4_K or Q6_K matrix (`ngroups` a row) is: a last odd row's
   partner is zeros (gpu/weights.py) */
inline size_t paired_group(size_t row, int ngroups, int j)
{
    return (row & ~(size_t)1) * ngroups + 2 * j + (row & 1);
}

/* A Q6_K group's 16 scales (one per 16 weights) times its d */
inline float16 q6_k_scales(__global const uchar *group, __global const float *dm, size_t g)
{
    const float d = halves_to_float8((ushort8)(((__global const ushort *)dm)[g])).s0;
    return convert_float16(((__global const char16 *)(group + 192))[0]) * d;
}

__attribute__((always_inline)) inline void load_block(const int wtype, __global const uchar *qs,
                       __global const float *dm, size_t row, int nb, int b,
                       float16 *lo, float16 *hi)
{
    const size_t blk = row * nb + b;
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
        /* block u of its super-block is sub-blocks 2u, 2u + 1: lanes 4u..4u + 3, 8 bytes */
        const size_t sb = blk / 8;
        const uint u = blk % 8;
        const uint2 w = ((__global const uint2 *)qs)[blk];
        const uint16 odd = LANES & 1u, f = LANES >> 1;
        uint16 q0 = ((uint16)(w.x) >> (16u * odd + 2u * f)) & 3u, q1 = ((uint16)(w.y) >> (16u * odd + 2u * f)) & 3u;
        if (wtype == WT_Q2) {
            __global const float *rec = dm + 6 * sb;
            const uint s0 = ((__global const uchar *)rec)[2 * u], s1 = ((__global const uchar *)rec)[2 * u + 1];
            *lo = convert_float16(q0) * (rec[4] * (float)(s0 & 15u)) - rec[5] * (float)(s0 >> 4);
            *hi = convert_float16(q1) * (rec[4] * (float)(s1 & 15u)) - rec[5] * (float)(s1 >> 4);
        } else {
            __global const float *rec = dm + 16 * sb;
            const uint h = ((__global const uint *)rec)[u];
            __global const char *sc = (__global const char *)rec + 32;
            q0 |= (((uint16)(h) >> (8u * odd + f)) & 1u) << 2;
            q1 |= (((uint16)(h) >> (16u + 8u * odd + f)) & 1u) << 2;
            *lo = (convert_float16(q0) - 4.0f) * (rec[12] * sc[2 * u]);
            *hi = (convert_float16(q1) - 4.0f) * (rec[12] * sc[2 * u + 1]);
        }
    } else if (wtype == WT_Q4_K) {
        __global const uchar *group = qs + (size_t)Q4_K_GROUP * paired_group(row, nb / 8, b / 8);
        const uchar16 q = ((__global const uchar16 *)group)[GROUP_SLOT(b % 8)];
        float8 scale, offset;
        q4_k_scales(((__global const uint4 *)(group + 128))[0], &scale, &offset);
        const float d = scale[b % 8], m = offset[b % 8];
        *lo = convert_float16(q & (uchar)15) * d + m;
        *hi = convert_float16(q >> (uchar)4) * d + m;
    } else if (wtype == WT_Q6_K) {
        const size_t g = paired_group(row, nb / 8, b / 8);
        __global const uchar *group = qs + (size_t)Q6_K_GROUP * g;
        const uint j = b % 8, slot = GROUP_SLOT(j);
        const uchar16 q = ((__global const uchar16 *)group)[slot];
        /* its nibble bytes' high bits: the low or high four bits of 16 bytes of its half group's */
        const uchar16 h = (((__global const uchar16 *)(group + 128))[2 * (slot / 4) + slot % 2] >> (uchar)(4 * (slot / 2 % 2))) & (uchar)15;
        const float16 s = q6_k_scales(group, dm, g);
        *lo = (convert_float16(convert_uint16(q & (uchar)15) | (convert_uint16(h & (uchar)3) << 4)) - 32.0f) * s[2 * j];
        *hi = (convert_float16(convert_uint16(q >> (uchar)4) | (convert_uint16(h >> (uchar)2) << 4)) - 32.0f) * s[2 * j + 1];
    } else if (wtype == WT_Q5_0) {
        __global const uchar *group = qs + (size_t)Q5_0_GROUP * (blk / 8);
        const uint j = blk % 8;
        const uchar16 q = ((__global const uchar16 *)group)[j];
        const uint16 qh = (uint16)(((__global const uint *)(group + 128))[j]);
        const float d = halves_to_float8(((__global const ushort8 *)(group + 160))[0])[j], m = -16.0f * d;
        *lo = convert_float16(convert_uint16(q & (uchar)15) | (((qh >> LANES) & 1u) << 4)) * d + m;
        *hi = convert_float16(convert_uint16(q >> (uchar)4) | (((qh >> (LANES + 16u)) & 1u) << 4)) * d + m;
    } else if (wtype == WT_Q8X2) {
        __global const char16 *q = (__global const char16 *)qs;
        const float4 s = ((__global const float4 *)dm)[blk];
        *lo = convert_float16(q[2 * blk]) * s.x + s.y;
        *hi = convert_float16(q[2 * blk + 1]) * s.z + s.w;
    } else if (wtype == WT_Q8_0) {
        __global const char16 *q = (__global const char16 *)qs;
        const float d = dm[blk];
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
