/* Quantized weight blocks, shared by every kernel that reads weights.
 *
 * Weights stay quantized on the device in blocks of 32 along a row. The host
 * repacks GGUF blocks into two arrays so vector loads are aligned:
 *   Q4_1  qs[row][b] = 16 bytes of nibbles   dm[row][b] = half2 (d, m)
 *         weight j of the block: low nibbles hold j = 0..15, high 16..31;
 *         w = d * q + m
 *   Q8_0  qs[row][b] = 32 int8               dm[row][b] = half d
 *         w = d * q
 *   F32   qs = the float row itself          dm unused
 * `load_block` returns the 32 weights of block `blk` as lo (0..15), hi (16..31).
 * `wtype` is a literal at every call site, so the branches fold away.
 *
 * Vector loads are plain dereferences of aligned vector pointers (every offset
 * below is a multiple of 16 elements): PoCL does not inline vloadN/vload_half,
 * and a function call per load made the matmuls several times slower.
 */
/* F16(i, p): the i-th float16 at p, like vload16(i, p) */
#define F16(i, p) (((__global const float16 *)(p))[i])

/* IEEE half -> float by moving the exponent and mantissa into place and
 * rescaling by 2^(127 - 15); exact for normal and subnormal halves. */
inline float half_bits_to_float(uint h)
{
    const float magnitude = as_float((h & 0x7fffu) << 13) * 0x1p112f;
    return as_float(as_uint(magnitude) | ((h & 0x8000u) << 16));
}
#define WT_Q4_1 0
#define WT_Q8_0 1
#define WT_F32 2

__attribute__((always_inline)) inline void load_block(const int wtype, __global const uchar *qs,
                       __global const half *dm, size_t blk,
                       float16 *lo, float16 *hi)
{
    if (wtype == WT_Q4_1) {
        const uchar16 q = ((__global const uchar16 *)qs)[blk];
        const uint s = ((__global const uint *)dm)[blk];
        const float d = half_bits_to_float(s & 0xffffu), m = half_bits_to_float(s >> 16);
        *lo = convert_float16(q & (uchar)15) * d + m;
        *hi = convert_float16(q >> (uchar)4) * d + m;
    } else if (wtype == WT_Q8_0) {
        __global const char16 *q = (__global const char16 *)qs;
        const float d = half_bits_to_float(((__global const ushort *)dm)[blk]);
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
