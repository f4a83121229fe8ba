/* Quantized weight blocks, shared by every kernel that reads weights.
 *
 * Weights stay quantized on the device in blocks of 32 along a row. The host
 * repacks GGUF blocks into two arrays so vector loads are aligned:
 *   Q4_1  qs[row][b] = 16 bytes of nibbles   dm[row][b] = float2 (d, m)
 *         weight j of the block: low nibbles hold j = 0..15, high 16..31;
 *         w = d * q + m
 *   Q8_0  qs[row][b] = 32 int8               dm[row][b] = float d
 *         w = d * q
 *   F32   qs = the float row itself          dm unused
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

/* Every weight type the kernels read, as X(kernel suffix, WT_ constant). Each
 * kernel family instantiates its weight-reading kernels once per entry, so a new
 * type is: a WT_ constant, its branch in load_block, its entry here, and its
 * packing in gpu/weights.py. Nothing in cpu/ or gpu/ changes. */
#define FOR_EACH_WTYPE(X) X(q4_1, WT_Q4_1) X(q8_0, WT_Q8_0) X(f32, WT_F32)

__attribute__((always_inline)) inline void load_block(const int wtype, __global const uchar *qs,
                       __global const float *dm, size_t blk,
                       float16 *lo, float16 *hi)
{
    if (wtype == WT_Q4_1) {
        const uchar16 q = ((__global const uchar16 *)qs)[blk];
        const float2 s = ((__global const float2 *)dm)[blk];
        *lo = convert_float16(q & (uchar)15) * s.x + s.y;
        *hi = convert_float16(q >> (uchar)4) * s.x + s.y;
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
