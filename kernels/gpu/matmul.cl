/* GPU family: quantized matrix times a batch of vectors, layer glue fused in.
 * Built after quant.cl, common.cl and gpu/reduce.cl. The host passes WG, the work-group size it
 * read from the device (a power of two, 16..256).
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
 *               reduction across the LPU work-items: a subgroup butterfly where
 *               the device has shuffles, else a tree through local memory.
 *   mm_<type>   prefill (many columns): a work-group computes 32 rows x 32
 *               columns, staging two blocks at a time of the dequantized weights
 *               and of the inputs in local memory.
 * Which one a step takes depends on its batch, so both add every dot product in
 * the one order reduce.cl fixes: a row's result is the same bits whatever else
 * shares the step (tests/test_engine_invariance.py).
 *
 * Both compute, for unit u and column c, the pair of dot products an epilogue
 * needs together, and both run every op (a uniform branch, `op`):
 *   OP_MATMUL  rows (2u, 2u+1): y[c] = W . n(x[c]) (+ y[c], the residual add)
 *   OP_QKV     rows (2u, 2u+1): RoPE the pair, store q, or K/V into the cache
 *   OP_SWIGLU  rows (u, rows+u): h[c][u] = act(gate) * up  (silu or GELU, common.cl)
 * n(x) is the optional RMSNorm (W . (g*x)) / rms(x), as in cpu/matmul.cl.
 */

#define OP_MATMUL 0
#define OP_SWIGLU 1
#define OP_QKV 2
#define MV_TILE 8   /* columns one pass of mv serves */
#define MM_ROWS 32  /* rows (16 units) x columns of one mm work-group */
#define MM_COLS 32
#define MM_Q4 17    /* float4s per staged row: two blocks, and one against bank conflicts */
#define MM_CPL (MM_COLS * 16 / WG)  /* columns per work-item in mm */

#define GPU_MATMUL_ARGS                                                          \
    __global const uchar *qs, __global const float *dm, __global const float *g, \
    __global const float *x, __global const int *xrows, float eps,               \
    __global float *y, int rows, int k, int ncols, int op, int normalize,        \
    int accumulate, __global const int *pos, __global const int *seq,           \
    __global const int *tables, int max_blocks, __global const float *rope, \
    __global half *kcache, __global half *vcache, int layer, int lpu

/* A staged block half (16 floats) in local memory, as float4s: a float16 there
 * would need 64-byte alignment the padded rows do not have. */
inline void stage16(__local float4 *p, float16 v)
{
    p[0] = v.s0123;
    p[1] = v.s4567;
    p[2] = v.s89ab;
    p[3] = v.scdef;
}

inline float16 unstage16(__local const float4 *p)
{
    return (float16)(p[0], p[1], p[2], p[3]);
}

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

/* Write unit u of column c from its two dot products (already scaled by 1/rms). */
inline void epilogue(int op, int u, int c, float2 v, __global float *y, int rows,
                     int accumulate, __global const int *pos, __global const int *seq,
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
        if (accumulate)
            out += yc[r + i];
        yc[r + i] = out;
    }
}

/* 1/rms of columns c0 .. c0 + n - 1 into inv, n <= MM_COLS (scratch holds
 * n * NORM_STRANDS floats): strand r of a column adds the squares of elements
 * r, r + 32, ... in turn, and the strands meet in reduce.cl's pairwise tree.
 * mv and mm both call it, so a column's scale never depends on which kernel
 * its step took, nor on WG; and it costs two barriers, not a tree's worth. */
#define NORM_STRANDS 32
inline void column_norms(__global const float *x, int k, __global const int *xrows, int c0, int n,
                         float eps, __local float *scratch, __local float *inv)
{
    for (int i = get_local_id(0); i < n * NORM_STRANDS; i += WG) {
        __global const float *xc = x + (size_t)xrows[c0 + i / NORM_STRANDS] * k;
        float a = 0.0f;
        for (int j = i % NORM_STRANDS; j < k; j += NORM_STRANDS)
            a += xc[j] * xc[j];
        scratch[i] = a;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int c = get_local_id(0); c < n; c += WG)
        inv[c] = rsqrt(tree_local(scratch + c * NORM_STRANDS, NORM_STRANDS) / k + eps);
    barrier(CLK_LOCAL_MEM_FENCE);
}

/* ======================================================================== */
/* Decode: work-items cooperate on a unit, reduce across the unit's lanes    */
/* ======================================================================== */
/* Lane l of a unit sums its blocks l, l + lpu, ... (reduce.cl's order); the
 * lanes' partials meet in the pairwise tree: a subgroup butterfly where the
 * device has shuffles (SUBGROUPS), else through local memory. */
#if SUBGROUPS
#define MV_COMBINE(a, tile, scratch, lid, lane, lpu)                           \
    for (int i = 0; i < 2 * MV_TILE; i++)                                       \
        if (i < 2 * (tile))                                                     \
            a[i] = tree_lanes(a[i], lpu, scratch);
#define MV_RESULT(a, c, scratch, lid, lane, lpu) (float2)(a[2 * (c)], a[2 * (c) + 1])
#else
#define MV_COMBINE(a, tile, scratch, lid, lane, lpu)                           \
    for (int i = 0; i < 2 * MV_TILE; i++)                                       \
        scratch[i * WG + lid] = a[i];                                           \
    barrier(CLK_LOCAL_MEM_FENCE);
#define MV_RESULT(a, c, scratch, lid, lane, lpu)                                \
    (float2)(tree_local(scratch + 2 * (c) * WG + (lid - lane), lpu),            \
             tree_local(scratch + (2 * (c) + 1) * WG + (lid - lane), lpu))
#endif

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
        if (normalize)                                                          \
            column_norms(x, k, xrows, c0, tile, eps, scratch, inv);             \
        float a[2 * MV_TILE];                                                   \
        for (int i = 0; i < 2 * MV_TILE; i++)                                   \
            a[i] = 0.0f;                                                        \
        for (int b = lane; b < nb; b += lpu) {                                  \
            float16 lo0, hi0, lo1, hi1;                                         \
            load_block(WTYPE, qs, dm, rr.x, nb, b, &lo0, &hi0);                 \
            load_block(WTYPE, qs, dm, rr.y, nb, b, &lo1, &hi1);                 \
            const float16 glo = F16(2 * b, g), ghi = F16(2 * b + 1, g);         \
            lo0 *= glo; hi0 *= ghi; lo1 *= glo; hi1 *= ghi;                     \
            for (int c = 0; c < MV_TILE; c++) {                                 \
                if (c >= tile)                                                  \
                    break;                                                      \
                __global const float *xc = x + (size_t)xrows[c0 + c] * k;       \
                const float16 xlo = F16(2 * b, xc), xhi = F16(2 * b + 1, xc);   \
                a[2 * c] += block_dot(lo0, hi0, xlo, xhi);                      \
                a[2 * c + 1] += block_dot(lo1, hi1, xlo, xhi);                  \
            }                                                                   \
        }                                                                       \
        MV_COMBINE(a, tile, scratch, lid, lane, lpu)                            \
        for (int c = 0; c < MV_TILE; c++)                                       \
            if (c < tile && c % lpu == lane) {                                  \
                float2 v = MV_RESULT(a, c, scratch, lid, lane, lpu);            \
                if (normalize)                                                  \
                    v *= inv[c];                                                \
                if (u < units)                                                  \
                    epilogue(op, u, c0 + c, v, y, rows, accumulate, pos, seq, tables, \
                             max_blocks, rope, kcache, vcache, layer);          \
            }                                                                   \
        barrier(CLK_LOCAL_MEM_FENCE);                                           \
    }                                                                           \
}
FOR_EACH_WTYPE(DEFINE_MV)

/* ======================================================================== */
/* Prefill: a 32 x 32 output tile, two blocks at a time through local memory */
/* ======================================================================== */
/* Work-item (iu, ic): unit iu of the tile's 16, columns ic, ic + WG/16, ...
 * Local rows 2*iu and 2*iu+1 hold that unit's two weight rows. The blocks are
 * staged in reduce.cl's lane order (lane_block), so each work-item adds a
 * lane's blocks into one partial and pushes it into the lane tree when the
 * lane's last block is in: the same sums, in the same order, as mv. */
#define DEFINE_MM(NAME, WTYPE)                                                  \
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))                        \
void mm_##NAME(GPU_MATMUL_ARGS)                                                 \
{                                                                               \
    __local float4 ws[MM_ROWS][MM_Q4];                                          \
    __local float4 xs[MM_COLS][MM_Q4];                                          \
    __local float scratch[MM_COLS * NORM_STRANDS];                              \
    __local float ss[MM_COLS];                                                  \
    const int lid = get_local_id(0), iu = lid % 16, ic = lid / 16;              \
    const int units = unit_count(op, rows), nb = k / 32;                        \
    const int u0 = get_group_id(0) * 16, c0 = get_group_id(1) * MM_COLS;       \
    if (normalize)                                                              \
        column_norms(x, k, xrows, c0, min(MM_COLS, ncols - c0), eps, scratch, ss); \
    float acc[2 * MM_CPL], tree[2 * MM_CPL][TREE_LEVELS];                       \
    for (int i = 0; i < 2 * MM_CPL; i++)                                        \
        acc[i] = 0.0f;                                                          \
    for (int q0 = 0; q0 < nb; q0 += 2) {                                        \
        /* stage: 32 rows x 2 blocks of weights, 32 columns x 2 blocks of inputs */ \
        for (int i = lid; i < MM_ROWS * 2; i += WG) {                           \
            const int lr = i / 2, sb = i % 2;                                   \
            const int2 rr = unit_rows(op, min(u0 + lr / 2, units - 1), rows);   \
            float16 lo = (float16)0.0f, hi = (float16)0.0f;                     \
            if (q0 + sb < nb) {                                                 \
                const int b = lane_block(q0 + sb, nb, lpu);                     \
                load_block(WTYPE, qs, dm, lr % 2 ? rr.y : rr.x, nb, b, &lo, &hi); \
                lo *= F16(2 * b, g);                                            \
                hi *= F16(2 * b + 1, g);                                        \
            }                                                                   \
            stage16(&ws[lr][8 * sb], lo);                                       \
            stage16(&ws[lr][8 * sb + 4], hi);                                   \
        }                                                                       \
        for (int i = lid; i < MM_COLS * 16; i += WG) {                          \
            const int lc = i / 16, f = i % 16, c = min(c0 + lc, ncols - 1);     \
            float4 v = (float4)0.0f;                                            \
            if (q0 + f / 8 < nb) {                                              \
                const int j = 32 * lane_block(q0 + f / 8, nb, lpu) + 4 * (f % 8); \
                v = vload4(0, x + (size_t)xrows[c] * k + j);                    \
            }                                                                   \
            xs[lc][f] = v;                                                      \
        }                                                                       \
        barrier(CLK_LOCAL_MEM_FENCE);                                           \
        for (int sb = 0; sb < 2 && q0 + sb < nb; sb++) {                        \
            const float16 w0lo = unstage16(&ws[2 * iu][8 * sb]);                \
            const float16 w0hi = unstage16(&ws[2 * iu][8 * sb + 4]);            \
            const float16 w1lo = unstage16(&ws[2 * iu + 1][8 * sb]);            \
            const float16 w1hi = unstage16(&ws[2 * iu + 1][8 * sb + 4]);        \
            for (int i = 0; i < MM_CPL; i++) {                                  \
                const int lc = ic + i * (WG / 16);                              \
                const float16 xlo = unstage16(&xs[lc][8 * sb]);                 \
                const float16 xhi = unstage16(&xs[lc][8 * sb + 4]);             \
                acc[2 * i] += block_dot(w0lo, w0hi, xlo, xhi);                  \
                acc[2 * i + 1] += block_dot(w1lo, w1hi, xlo, xhi);              \
            }                                                                   \
            const int b = lane_block(q0 + sb, nb, lpu);                         \
            if (b + lpu >= nb)  /* the lane's last block: its partial is whole */ \
                for (int i = 0; i < 2 * MM_CPL; i++) {                          \
                    tree_push(tree[i], acc[i], b % lpu);                        \
                    acc[i] = 0.0f;                                              \
                }                                                               \
        }                                                                       \
        barrier(CLK_LOCAL_MEM_FENCE);                                           \
    }                                                                           \
    const int u = u0 + iu;                                                      \
    for (int i = 0; i < MM_CPL; i++) {                                          \
        const int lc = ic + i * (WG / 16), c = c0 + lc;                         \
        float2 v = (float2)(tree_root(tree[2 * i], lpu), tree_root(tree[2 * i + 1], lpu)); \
        if (normalize)                                                          \
            v *= ss[lc];                                                        \
        if (u < units && c < ncols)                                             \
            epilogue(op, u, c, v, y, rows, accumulate, pos, seq, tables,        \
                     max_blocks, rope, kcache, vcache, layer);                  \
    }                                                                           \
}
FOR_EACH_WTYPE(DEFINE_MM)
