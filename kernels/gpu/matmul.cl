/* GPU family: quantized matrix times a batch of vectors, layer glue fused in.
 * Built after quant.cl, common.cl and gpu/reduce.cl. The host passes WG, the work-group size it
 * read from the device (a power of two, 16..256), and D_MODEL.
 *
 * Decode reads every weight once per step, so a decode matmul must stream the
 * weights at full memory bandwidth: many work-groups, neighbouring work-items
 * reading neighbouring bytes, each dequantized block used for every vector of
 * the batch. Prefill is compute-bound: a tiled matmul through local memory.
 *
 *   mv_<type>   decode (a few columns): LPU work-items cooperate on a unit of
 *               two rows, work-item i reading blocks i, i+LPU, ... of both rows
 *               (LPU neighbours read LPU neighbouring blocks: coalesced), each
 *               block dequantized once and multiplied into every column; then a
 *               reduction through local memory.
 *   mm_<type>   prefill (many columns): a work-group computes 32 rows x 32
 *               columns, staging 64-wide slices of the dequantized weights and
 *               of the inputs in local memory.
 *
 * Both compute, for unit u and column c, the pair of dot products an epilogue
 * needs together, and both run every op (a uniform branch, `op`):
 *   OP_MATMUL  rows (2u, 2u+1): y[c] = W . n(x[c]) (+ y[c] + parts[c], residual)
 *   OP_QKV     rows (2u, 2u+1): RoPE the pair, store q, or K/V into the cache
 *   OP_SWIGLU  rows (u, rows+u): h[c][u] = act(gate) * up  (silu or GELU, common.cl)
 * n(x) is the optional RMSNorm (W . (g*x)) / rms(x), as in cpu/matmul.cl.
 * `parts` are the attention's per-KV-head output projections (attention.cl):
 * the SwiGLU input is x + sum(parts), and the down projection's residual adds
 * them into x, so no launch of its own is needed to combine them.
 */

#define OP_MATMUL 0
#define OP_SWIGLU 1
#define OP_QKV 2
#define MV_TILE 8   /* columns one pass of mv serves */
#define MM_ROWS 32  /* rows (16 units) x columns of one mm work-group */
#define MM_COLS 32
#define MM_K 64     /* k per staged slice: two blocks */
#define MM_CPL (MM_COLS * 16 / WG)  /* columns per work-item in mm */

#define GPU_MATMUL_ARGS                                                          \
    __global const uchar *qs, __global const float *dm, __global const float *g, \
    __global const float *x, __global const int *xrows,                          \
    __global const float *parts, int nparts, int part_stride, float eps,         \
    __global float *y, int rows, int k, int ncols, int op, int normalize,        \
    int accumulate, __global const int *pos, __global const int *seq,           \
    __global const int *tables, int max_blocks, __global const float *rope, \
    __global half *kcache, __global half *vcache, int layer, int lpu

/* The two weight rows of unit u. */
inline int2 unit_rows(int op, int u, int rows)
{
    if (op == OP_SWIGLU)
        return (int2)(u, rows + u);
    return (int2)(2 * u, min(2 * u + 1, rows - 1));  /* an odd last row pairs with itself */
}

inline int unit_count(int op, int rows)
{
    return op == OP_SWIGLU ? rows : (rows + 1) / 2;
}

/* Element j of column c's input: x plus the attention parts where the op reads them. */
inline float input_at(__global const float *x, __global const float *parts, int nparts,
                      int part_stride, int k, int xrow, int j)
{
    float v = x[(size_t)xrow * k + j];
    for (int p = 0; p < nparts; p++)
        v += parts[(size_t)p * part_stride + (size_t)xrow * k + j];
    return v;
}

/* Write unit u of column c from its two dot products (already scaled by 1/rms). */
inline void epilogue(int op, int u, int c, float2 v, __global float *y, int rows,
                     int accumulate, __global const float *parts, int nparts, int part_stride,
                     __global const int *pos, __global const int *seq,
                     __global const int *tables, int max_blocks,
                     __global const float *rope, __global half *kcache,
                     __global half *vcache, int layer)
{
    if (op == OP_SWIGLU) {
        y[(size_t)c * rows + u] = activate(v.x) * v.y;
        return;
    }
    const int r = 2 * u;
    if (op == OP_QKV) {
        const int p = pos[c];
        const int block = tables[seq[c] * max_blocks + p / BLOCK_SIZE];
        rope_store(r, v, c, p, block, rope, y, kcache, vcache, layer);
        return;
    }
    __global float *yc = y + (size_t)c * rows;
    for (int i = 0; i < 2 && r + i < rows; i++) {
        float out = i ? v.y : v.x;
        if (accumulate) {
            out += yc[r + i];
            for (int p = 0; p < nparts; p++)
                out += parts[(size_t)p * part_stride + (size_t)c * rows + r + i];
        }
        yc[r + i] = out;
    }
}

/* ======================================================================== */
/* Decode: work-items cooperate on a unit, reduce through local memory       */
/* ======================================================================== */
#define DEFINE_MV(NAME, WTYPE)                                                  \
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))                        \
void mv_##NAME(GPU_MATMUL_ARGS)                                                 \
{                                                                               \
    __local float scratch[2 * MV_TILE * WG];                                    \
    __local float inv[MV_TILE];                                                 \
    const int lid = get_local_id(0), lane = lid % lpu;                          \
    const int u = get_group_id(0) * (WG / lpu) + lid / lpu;                     \
    const int units = unit_count(op, rows), nb = k / 32;                        \
    const int2 rr = unit_rows(op, min(u, units - 1), rows);                     \
    for (int c0 = 0; c0 < ncols; c0 += MV_TILE) {                               \
        const int tile = min(MV_TILE, ncols - c0);                              \
        float a[2 * MV_TILE];                                                   \
        /* 1/rms of each column, every work-item summing a strided share */     \
        for (int c = 0; c < MV_TILE; c++) {                                     \
            a[c] = 0.0f;                                                        \
            if (normalize && c < tile)                                          \
                for (int j = lid; j < k; j += WG) {                             \
                    const float v = input_at(x, parts, op == OP_SWIGLU ? nparts : 0, \
                                             part_stride, k, xrows[c0 + c], j); \
                    a[c] += v * v;                                              \
                }                                                               \
        }                                                                       \
        if (normalize) {                                                        \
            wg_sum(a, MV_TILE, scratch, inv);                                   \
            if (lid < MV_TILE)                                                  \
                inv[lid] = rsqrt(inv[lid] / k + eps);                           \
            barrier(CLK_LOCAL_MEM_FENCE);                                       \
        }                                                                       \
        for (int i = 0; i < 2 * MV_TILE; i++)                                   \
            a[i] = 0.0f;                                                        \
        for (int b = lane; b < nb; b += lpu) {                                  \
            float16 lo0, hi0, lo1, hi1;                                         \
            load_block(WTYPE, qs, dm, (size_t)rr.x * nb + b, &lo0, &hi0);       \
            load_block(WTYPE, qs, dm, (size_t)rr.y * nb + b, &lo1, &hi1);       \
            const float16 glo = F16(2 * b, g), ghi = F16(2 * b + 1, g);         \
            lo0 *= glo; hi0 *= ghi; lo1 *= glo; hi1 *= ghi;                     \
            for (int c = 0; c < tile; c++) {                                    \
                const int xr = xrows[c0 + c];                                   \
                float16 xlo = F16(2 * b, x + (size_t)xr * k);                   \
                float16 xhi = F16(2 * b + 1, x + (size_t)xr * k);               \
                if (op == OP_SWIGLU)                                            \
                    for (int p = 0; p < nparts; p++) {                          \
                        __global const float *pp = parts + (size_t)p * part_stride + (size_t)xr * k; \
                        xlo += F16(2 * b, pp);                                  \
                        xhi += F16(2 * b + 1, pp);                              \
                    }                                                           \
                a[2 * c] += hsum16(lo0 * xlo + hi0 * xhi);                      \
                a[2 * c + 1] += hsum16(lo1 * xlo + hi1 * xhi);                  \
            }                                                                   \
        }                                                                       \
        /* reduce over the lpu work-items of each unit */                       \
        for (int i = 0; i < 2 * MV_TILE; i++)                                   \
            scratch[i * WG + lid] = a[i];                                       \
        barrier(CLK_LOCAL_MEM_FENCE);                                           \
        for (int c = lane; c < tile; c += lpu) {                                \
            float2 v = (float2)(0.0f);                                          \
            const int first = lid - lane;                                       \
            for (int i = 0; i < lpu; i++)                                       \
                v += (float2)(scratch[2 * c * WG + first + i], scratch[(2 * c + 1) * WG + first + i]); \
            if (normalize)                                                      \
                v *= inv[c];                                                    \
            if (u < units)                                                      \
                epilogue(op, u, c0 + c, v, y, rows, accumulate, parts, nparts, part_stride, \
                         pos, seq, tables, max_blocks, rope, kcache, vcache, layer); \
        }                                                                       \
        barrier(CLK_LOCAL_MEM_FENCE);                                           \
    }                                                                           \
}
FOR_EACH_WTYPE(DEFINE_MV)

/* ======================================================================== */
/* Prefill: a 32 x 32 output tile, 64-wide slices through local memory       */
/* ======================================================================== */
/* Work-item (iu, ic): unit iu of the tile's 16, columns ic, ic + WG/16, ...
 * Local rows 2*iu and 2*iu+1 hold that unit's two weight rows. */
#define DEFINE_MM(NAME, WTYPE)                                                  \
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))                        \
void mm_##NAME(GPU_MATMUL_ARGS)                                                 \
{                                                                               \
    __local float ws[MM_ROWS][MM_K + 1];                                        \
    __local float xs[MM_COLS][MM_K + 1];                                        \
    __local float ss[MM_COLS];                                                  \
    const int lid = get_local_id(0), iu = lid % 16, ic = lid / 16;              \
    const int units = unit_count(op, rows), nb = k / 32;                        \
    const int u0 = get_group_id(0) * 16, c0 = get_group_id(1) * MM_COLS;       \
    const int in_parts = op == OP_SWIGLU ? nparts : 0;                          \
    float acc[2 * MM_CPL], sq[MM_CPL];                                          \
    for (int i = 0; i < MM_CPL; i++)                                            \
        acc[2 * i] = acc[2 * i + 1] = sq[i] = 0.0f;                             \
    for (int k0 = 0; k0 < k; k0 += MM_K) {                                      \
        /* stage: 32 rows x 2 blocks of weights, 32 columns x 64 inputs */      \
        for (int i = lid; i < MM_ROWS * (MM_K / 32); i += WG) {                 \
            const int lr = i / (MM_K / 32), b = k0 / 32 + i % (MM_K / 32);      \
            const int2 rr = unit_rows(op, min(u0 + lr / 2, units - 1), rows);   \
            float16 lo = (float16)0.0f, hi = (float16)0.0f;                     \
            if (b < nb) {                                                       \
                load_block(WTYPE, qs, dm, (size_t)(lr % 2 ? rr.y : rr.x) * nb + b, &lo, &hi); \
                lo *= F16(2 * b, g);                                            \
                hi *= F16(2 * b + 1, g);                                        \
            }                                                                   \
            __local float *w = &ws[lr][(i % (MM_K / 32)) * 32];                 \
            for (int j = 0; j < 16; j++) {                                      \
                w[j] = ((float *)&lo)[j];                                       \
                w[16 + j] = ((float *)&hi)[j];                                  \
            }                                                                   \
        }                                                                       \
        for (int i = lid; i < MM_COLS * MM_K; i += WG) {                        \
            const int lc = i / MM_K, j = i % MM_K, c = min(c0 + lc, ncols - 1); \
            xs[lc][j] = k0 + j < k ? input_at(x, parts, in_parts, part_stride, k, xrows[c], k0 + j) : 0.0f; \
        }                                                                       \
        barrier(CLK_LOCAL_MEM_FENCE);                                           \
        for (int j = 0; j < MM_K; j++) {                                        \
            const float w0 = ws[2 * iu][j], w1 = ws[2 * iu + 1][j];             \
            for (int i = 0; i < MM_CPL; i++) {                                  \
                const float xv = xs[ic + i * (WG / 16)][j];                     \
                acc[2 * i] += w0 * xv;                                          \
                acc[2 * i + 1] += w1 * xv;                                      \
                if (iu == 0)                                                    \
                    sq[i] += xv * xv;                                           \
            }                                                                   \
        }                                                                       \
        barrier(CLK_LOCAL_MEM_FENCE);                                           \
    }                                                                           \
    if (iu == 0)                                                                \
        for (int i = 0; i < MM_CPL; i++)                                        \
            ss[ic + i * (WG / 16)] = normalize ? rsqrt(sq[i] / k + eps) : 1.0f; \
    barrier(CLK_LOCAL_MEM_FENCE);                                               \
    const int u = u0 + iu;                                                      \
    for (int i = 0; i < MM_CPL; i++) {                                          \
        const int lc = ic + i * (WG / 16), c = c0 + lc;                         \
        if (u < units && c < ncols)                                             \
            epilogue(op, u, c, (float2)(acc[2 * i], acc[2 * i + 1]) * ss[lc], y, rows, \
                     accumulate, parts, nparts, part_stride, pos, seq, tables,  \
                     max_blocks, rope, kcache, vcache, layer);              \
    }                                                                           \
}
FOR_EACH_WTYPE(DEFINE_MM)
