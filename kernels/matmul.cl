/* Quantized matrix times a batch of vectors.
 *
 * Decode reads every weight once per step, so weight bytes are the cost of a
 * step. The kernels below keep the weights quantized on the device, dequantize a
 * block of 32 in registers and use it for every vector of the batch before
 * moving on: one weight read serves the whole batch.
 *
 * Shapes (row-major):  W [rows, k]   x [ncols, k]   y [ncols, rows]
 *                      y[c, r] = sum_j W[r, j] * x[c, j]
 * One work-item owns one output row r and walks the columns in tiles of TILE.
 */

/* ======================================================================== */
/* Weight blocks                                                             */
/* ======================================================================== */
/* The host repacks GGUF blocks into two arrays so vector loads are aligned:
 *   Q4_1  qs[row][b] = 16 bytes of nibbles   dm[row][b] = half2 (d, m)
 *         weight j of the block: low nibbles hold j = 0..15, high 16..31;
 *         w = d * q + m
 *   Q8_0  qs[row][b] = 32 int8               dm[row][b] = half d
 *         w = d * q
 *   F32   qs = the float row itself          dm unused
 * `load_block` returns the 32 weights of block `blk` as lo (0..15), hi (16..31).
 */
#define WT_Q4_1 0
#define WT_Q8_0 1
#define WT_F32 2

inline void load_block(const int wtype, __global const uchar *qs,
                       __global const half *dm, size_t blk,
                       float16 *lo, float16 *hi)
{
    if (wtype == WT_Q4_1) {
        uchar16 q = vload16(blk, qs);
        float2 s = vload_half2(blk, dm);
        *lo = fma(convert_float16(q & (uchar)15), (float16)s.x, (float16)s.y);
        *hi = fma(convert_float16(q >> (uchar)4), (float16)s.x, (float16)s.y);
    } else if (wtype == WT_Q8_0) {
        __global const char *q = (__global const char *)qs;
        float d = vload_half(blk, dm);
        *lo = convert_float16(vload16(2 * blk, q)) * d;
        *hi = convert_float16(vload16(2 * blk + 1, q)) * d;
    } else {
        __global const float *w = (__global const float *)qs;
        *lo = vload16(2 * blk, w);
        *hi = vload16(2 * blk + 1, w);
    }
}

inline float hsum16(float16 v)
{
    float8 a = v.lo + v.hi;
    float4 b = a.lo + a.hi;
    float2 c = b.lo + b.hi;
    return c.x + c.y;
}

/* ======================================================================== */
/* Row times a tile of columns                                               */
/* ======================================================================== */
/* out[c] = W[r, :] . x[c0 + c, :] for c < tile. `wtype` and `tile` are literals
 * at every call site, so after inlining the branches fold away and the
 * accumulators live in registers. Columns past ncols repeat the last one
 * (their results are dropped) so the loop stays branch-free. */
#define MAX_TILE 8

inline void row_dot_tile(const int wtype, const int tile,
                         __global const uchar *qs, __global const half *dm,
                         __global const float *x, int r, int k, int c0,
                         int ncols, float *out)
{
    const int nb = k / 32;
    float16 acc[MAX_TILE];
    __global const float *xc[MAX_TILE];
    for (int c = 0; c < tile; c++) {
        acc[c] = (float16)0.0f;
        xc[c] = x + (size_t)min(c0 + c, ncols - 1) * k;
    }
    for (int b = 0; b < nb; b++) {
        float16 lo, hi;
        load_block(wtype, qs, dm, (size_t)r * nb + b, &lo, &hi);
        for (int c = 0; c < tile; c++) {
            acc[c] = fma(lo, vload16(2 * b, xc[c]), acc[c]);
            acc[c] = fma(hi, vload16(2 * b + 1, xc[c]), acc[c]);
        }
    }
    for (int c = 0; c < tile; c++)
        out[c] = hsum16(acc[c]);
}

/* ======================================================================== */
/* Kernels                                                                   */
/* ======================================================================== */
/* matmul:  y[c, r] = (accumulate ? y[c, r] : 0) + W[r] . x[c]
 *          accumulate=1 fuses the residual add into the output projection.
 * swiglu:  W holds the gate rows then the up rows (2 * rows in all);
 *          y[c, r] = silu(gate[r] . x[c]) * (up[r] . x[c]),  silu(g) = g / (1 + e^-g)
 */
#define DEFINE_MATMUL(NAME, WTYPE, TILE)                                        \
__kernel void matmul_##NAME##_t##TILE(                                          \
    __global const uchar *qs, __global const half *dm,                          \
    __global const float *x, __global float *y,                                 \
    int rows, int k, int ncols, int accumulate)                                 \
{                                                                               \
    const int r = get_global_id(0);                                             \
    if (r >= rows) return;                                                      \
    for (int c0 = 0; c0 < ncols; c0 += TILE) {                                  \
        float out[TILE];                                                        \
        row_dot_tile(WTYPE, TILE, qs, dm, x, r, k, c0, ncols, out);            \
        for (int c = 0; c < TILE && c0 + c < ncols; c++) {                      \
            size_t i = (size_t)(c0 + c) * rows + r;                             \
            y[i] = accumulate ? y[i] + out[c] : out[c];                         \
        }                                                                       \
    }                                                                           \
}                                                                               \
__kernel void swiglu_##NAME##_t##TILE(                                          \
    __global const uchar *qs, __global const half *dm,                          \
    __global const float *x, __global float *y,                                 \
    int rows, int k, int ncols)                                                 \
{                                                                               \
    const int r = get_global_id(0);                                             \
    if (r >= rows) return;                                                      \
    for (int c0 = 0; c0 < ncols; c0 += TILE) {                                  \
        float g[TILE], u[TILE];                                                 \
        row_dot_tile(WTYPE, TILE, qs, dm, x, r, k, c0, ncols, g);              \
        row_dot_tile(WTYPE, TILE, qs, dm, x, r + rows, k, c0, ncols, u);       \
        for (int c = 0; c < TILE && c0 + c < ncols; c++)                        \
            y[(size_t)(c0 + c) * rows + r] = g[c] / (1.0f + exp(-g[c])) * u[c]; \
    }                                                                           \
}

#define DEFINE_MATMULS(NAME, WTYPE) \
    DEFINE_MATMUL(NAME, WTYPE, 1)   \
    DEFINE_MATMUL(NAME, WTYPE, 2)   \
    DEFINE_MATMUL(NAME, WTYPE, 4)   \
    DEFINE_MATMUL(NAME, WTYPE, 8)

DEFINE_MATMULS(q4_1, WT_Q4_1)
DEFINE_MATMULS(q8_0, WT_Q8_0)
DEFINE_MATMULS(f32, WT_F32)
