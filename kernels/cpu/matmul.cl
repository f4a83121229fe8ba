/* CPU family: quantized matrix times a batch of vectors, with the layer glue
 * fused in. Built after quant.cl and common.cl; the host passes WG (work-group size) and
 * MAX_COLS (most vectors in a batch) as -D constants.
 *
 * Decode reads every weight once per step, so weight bytes are the cost of a
 * step, and on a CPU device every kernel launch costs tens of microseconds. So
 * the kernels below keep weights quantized, dequantize a block of 32 in
 * registers and use it for every vector of the batch before moving on, and do
 * the work around each matmul in the same launch:
 *
 *   matmul  y[c] = (accumulate ? y[c] : 0) + W . n(x[c])   residual add fused
 *   swiglu  y[c] = act(Wgate . n(x[c])) * (Wup . n(x[c]))  act: silu or GELU (common.cl)
 *   qkv     [q|k|v] = Wqkv . n(x[c]), then RoPE and the K/V store (common.cl)
 *
 * Shapes (row-major):  W [rows, k]   x [*, k]   y [ncols, rows]
 * Column c reads x row xrows[c] (the output head only reads the sampled rows).
 * One work-item owns a PAIR of rows (r, r+1), the pair RoPE rotates together,
 * and walks the columns in tiles of TILE.
 */

#define MAX_TILE 8

/* The weight kinds whose matmuls a build makes (this file's float ones, lowbit.cl's and
 * nibbles.cl's): the host names those its model reads, -DMATMUL_KINDS and -DMATMUL_<name>
 * for each (gpu/families.py), since each kind's kernels add seconds to a cold build. A
 * build that names none, as the kernel tests' do, makes every kind's. */
#ifndef MATMUL_KINDS
#define MATMUL_f32
#define MATMUL_q8x2
#define MATMUL_q2
#define MATMUL_q3
#define MATMUL_nib
#define MATMUL_nib5
#define MATMUL_nib6
#define MATMUL_nib8
#define MATMUL_nibq4k
#define MATMUL_nibq6k
#define MATMUL_nibq50
#endif

/* ======================================================================== */
/* Input RMSNorm, folded into the matmul                                     */
/* ======================================================================== */
/* n(x) = x * g / rms(x),  rms(x) = sqrt(mean(x^2) + eps). Since
 *     W . (x * g / rms(x)) = (W . (x * g)) / rms(x)
 * g scales the dequantized weights once per block for every column of a wide
 * tile, or each column's inputs where a tile has one or two (fewer multiplies:
 * a pair of rows takes four per block, a column two), and 1/rms(x) the finished
 * dot product. The work-group computes 1/rms(x) for each column once, into
 * local memory (or copies what cpu/nibbles.cl's stage computed). Matmuls without
 * a norm (normalize = 0) skip g altogether. */
inline void column_scales_from(__global const float *x, __global const int *xrows, int c0, int n,
                               int k, float eps, int normalize, __local float *inv)
{
    for (int c = get_local_id(0); c < n; c += get_local_size(0)) {
        float s = 1.0f;
        if (normalize) {
            __global const float *xc = x + (size_t)xrows[c0 + c] * k;
            float16 ss = (float16)0.0f;
            for (int j = 0; j < k / 16; j++) {
                float16 v = F16(j, xc);
                ss += v * v;
            }
            s = rsqrt(hsum16(ss) / k + eps);
        }
        inv[c] = s;
    }
}

/* (column_scales_from: columns c0.. c0 + n - 1's scales into inv[0.. n - 1]) */
inline void column_scales(__global const float *x, __global const int *xrows,
                          int ncols, int k, float eps, int normalize,
                          __local float *inv)
{
    column_scales_from(x, xrows, 0, ncols, k, eps, normalize, inv);
    barrier(CLK_LOCAL_MEM_FENCE);
}

/* ======================================================================== */
/* Prefetching the weights                                                   */
/* ======================================================================== */
/* A matmul reads each weight once, in address order within a work-group (its
 * work-items' row pairs follow each other, and PoCL runs them one after another
 * on one core), yet the hardware prefetcher does not keep up with PoCL's
 * work-groups: a large matrix reads well below what the memory gives a kernel
 * that only sums its input, and worse under load. So every row pair asks for
 * the bytes PREFETCH_AHEAD on from what it reads now (later rows of its
 * work-group, or the next work-group's), and its scales as many rows on. A
 * prefetch is a hint: one past the end of a buffer is dropped, never a fault.
 * The distance spans a few row pairs of the widest rows a model has, not only
 * the rest of the row being read: the host sets it by the model
 * (gpu/families.py's prefetch_ahead). (The distances compared, and what each
 * bought, are in the commits that set them.) The bytes are asked into L2, not L1
 * (prefetcht1): a core has more misses in flight to L2 than to L1, and a decode
 * step's rate is what it has in flight. */
#ifndef PREFETCH_AHEAD
#define PREFETCH_AHEAD 4096
#endif
#ifndef PREFETCH  /* (a build may define it empty, to compare) */
/* CPU targets only: there every address space is one, while a GPU's compiler (NVIDIA's)
   refuses a __global pointer for the builtin's generic one */
#if defined(__has_builtin) && __has_builtin(__builtin_prefetch) \
    && (defined(__x86_64__) || defined(__i386__) || defined(__aarch64__) || defined(__riscv))
#define PREFETCH(p) __builtin_prefetch(p, 0, 2)  /* (read, locality 2: prefetcht1) */
#else
#define PREFETCH(p)
#endif
#endif

/* A block's bytes in qs and in dm, on average (compact Q5_0 keeps its scales in qs, a
   group's at its end; Q4_K and Q6_K, in row pairs, take prefetch_run) */
#define QS_BYTES(wtype) ((wtype) == WT_F32 ? 128 : (wtype) == WT_Q8_0 || (wtype) == WT_Q8X2 ? 32 \
    : (wtype) == WT_Q5_0 ? Q5_0_GROUP / 8 : 16)
#define DM_BYTES(wtype) ((wtype) == WT_F32 || (wtype) == WT_Q5_0 ? 0 \
    : (wtype) == WT_Q8_0 ? 4 : (wtype) == WT_Q4_1 ? 8 : 16)

/* Rows r0's and r1's next `n` blocks from block `blk` of their rows (nb a row): `qbytes`
   and `dbytes` a block in qs and dm, literals at every call site. */
__attribute__((always_inline)) inline void prefetch_pair(__global const uchar *qs, __global const float *dm,
        int r0, int r1, int nb, int blk, const int n, const int qbytes, const int dbytes)
{
    const size_t b0 = (size_t)r0 * nb + blk, b1 = (size_t)r1 * nb + blk;
    __global const uchar *d = (__global const uchar *)dm + PREFETCH_AHEAD / qbytes * dbytes;
    for (int i = 0; i < n * qbytes; i += 64) {
        PREFETCH(qs + b0 * qbytes + PREFETCH_AHEAD + i);
        PREFETCH(qs + b1 * qbytes + PREFETCH_AHEAD + i);
    }
    if (dbytes) {
        PREFETCH(d + b0 * dbytes);
        PREFETCH(d + b1 * dbytes);
    }
}

/* `n` bytes from `at`, PREFETCH_AHEAD on: a row pair's groups of the super-block kinds,
   which lie side by side (quant.cl's paired_group) */
__attribute__((always_inline)) inline void prefetch_run(__global const uchar *at, const int n)
{
    for (int i = 0; i < n; i += 64)
        PREFETCH(at + PREFETCH_AHEAD + i);
}

/* ======================================================================== */
/* A pair of rows times a tile of columns                                    */
/* ======================================================================== */
/* out0[c] = W[r] . (g * x[c0+c]),  out1[c] = W[r+1] . (g * x[c0+c]),  c < tile,
 * or without g when `scaled` is 0. `wtype`, `tile` and `scaled` are literals at
 * every call site: after inlining the accumulators live in registers. Columns
 * past ncols repeat the last one (their results are dropped) so the inner loop
 * stays branch-free. */
__attribute__((always_inline)) inline void pair_dot_tile(const int wtype, const int tile, const int scaled,
                          __global const uchar *qs, __global const float *dm,
                          __global const float *g, __global const float *x,
                          __global const int *xrows, int r0, int r1, int k,
                          int c0, int ncols, float *out0, float *out1)
{
    const int nb = k / 32;
    float16 a0[MAX_TILE], a1[MAX_TILE];
    __global const float *xc[MAX_TILE];
    for (int c = 0; c < tile; c++) {
        a0[c] = a1[c] = (float16)0.0f;
        xc[c] = x + (size_t)xrows[min(c0 + c, ncols - 1)] * k;
    }
    for (int b = 0; b < nb; b++) {
        float16 lo0, hi0, lo1, hi1;
        prefetch_pair(qs, dm, r0, r1, nb, b, 1, QS_BYTES(wtype), DM_BYTES(wtype));
        load_block(wtype, qs, dm, r0, nb, b, &lo0, &hi0);
        load_block(wtype, qs, dm, r1, nb, b, &lo1, &hi1);
        const float16 glo = scaled ? F16(2 * b, g) : 1.0f, ghi = scaled ? F16(2 * b + 1, g) : 1.0f;
        if (scaled && tile > 2) {
            lo0 *= glo; hi0 *= ghi; lo1 *= glo; hi1 *= ghi;
        }
        for (int c = 0; c < tile; c++) {
            float16 xlo = F16(2 * b, xc[c]), xhi = F16(2 * b + 1, xc[c]);
            if (scaled && tile <= 2) {
                xlo *= glo; xhi *= ghi;
            }
            a0[c] += lo0 * xlo + hi0 * xhi;
            a1[c] += lo1 * xlo + hi1 * xhi;
        }
    }
    for (int c = 0; c < tile; c++) {
        out0[c] = hsum16(a0[c]);
        out1[c] = hsum16(a1[c]);
    }
}

/* ======================================================================== */
/* Kernels, one set per weight type and tile                                 */
/* ======================================================================== */
#define MATMUL_ARGS                                                             \
    __global const uchar *qs, __global const float *dm, __global const float *g, \
    __global const float *x, __global const int *xrows, float eps,              \
    __global float *y, int rows, int k, int ncols

/* How every kernel below starts: the input columns' RMS scales in local memory
   (all 1 when `normalize` is 0), then the pair of output rows this item owns. */
#define MATMUL_PROLOGUE(normalize)                                              \
    __local float inv[MAX_COLS];                                                \
    column_scales(x, xrows, ncols, k, eps, normalize, inv);                     \
    const int r = 2 * get_global_id(0);                                         \
    if (r >= rows) return;

/* act(gate) of the row pair's columns c8 + j, j < n (n <= 8), times their RMS scales:
   column j's rows in lanes 2j and 2j + 1 of one 16-lane vector whatever the tile's width,
   so a column's bits do not depend on it (and its exp is one vector's work, not sixteen
   scalars'). Eight columns, the usual case, take whole vectors: lane by lane, PoCL's
   compiler moves each value through the stack. */
__attribute__((always_inline)) inline float16 activate_gates8(const float *g0, const float *g1, int c8, int n,
                                                            __local const float *inv)
{
    if (n == 8) {
        const uint16 pairs = (uint16)(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
        const float16 s = vload8(0, inv + c8).s0011223344556677;
        return activate16(shuffle2(vload8(0, g0 + c8), vload8(0, g1 + c8), pairs) * s);
    }
    float16 gate = 0.0f;
    for (int j = 0; j < n; j++) {
        const float s = inv[c8 + j];
        gate[2 * j] = g0[c8 + j] * s;
        gate[2 * j + 1] = g1[c8 + j] * s;
    }
    return activate16(gate);
}

/* y[(c8 + j) * rows + {0, 1}] = act * up for the same columns, `act` activate_gates8's */
__attribute__((always_inline)) inline void store_swiglu8(float16 act, const float *u0, const float *u1, int c8, int n,
                                                       __local const float *inv, __global float *y, int rows)
{
    if (n == 8) {
        const uint16 pairs = (uint16)(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
        const float16 s = vload8(0, inv + c8).s0011223344556677;
        const float16 h = act * (shuffle2(vload8(0, u0 + c8), vload8(0, u1 + c8), pairs) * s);
#pragma unroll
        for (int j = 0; j < 8; j++)
            vstore2((float2)(h[2 * j], h[2 * j + 1]), 0, y + (size_t)(c8 + j) * rows);
        return;
    }
    float16 up = 0.0f;
    for (int j = 0; j < n; j++) {
        const float s = inv[c8 + j];
        up[2 * j] = u0[c8 + j] * s;
        up[2 * j + 1] = u1[c8 + j] * s;
    }
    const float16 h = act * up;
    for (int j = 0; j < n; j++)
        *(__global float2 *)(y + (size_t)(c8 + j) * rows) = (float2)(h[2 * j], h[2 * j + 1]);
}

/* The fused kernels' epilogues for one row pair and the n columns of a tile from c0 (inv,
   y, and for qkv t, start at c0): */

/* matmul: rows r and r1 (r1 == r: the last row, alone) times the columns' RMS scales,
   added to y's where `accumulate` */
__attribute__((always_inline)) inline void store_rows(const float *o0, const float *o1, int n, int r, int r1, int accumulate,
                                                     __local const float *inv, __global float *y, int rows)
{
    for (int c = 0; c < n; c++) {
        __global float *yc = y + (size_t)c * rows;
        const float s = inv[c];
        yc[r] = o0[c] * s + (accumulate ? yc[r] : 0.0f);
        if (r1 != r)
            yc[r1] = o1[c] * s + (accumulate ? yc[r1] : 0.0f);
    }
}

/* swiglu: the gates' activations, eight columns a vector, as soon as the gates are done:
   the up rows' products then run beside their chain of multiply-adds, which a lone
   column would wait on */
__attribute__((always_inline)) inline void activate_gates(const float *g0, const float *g1, int n, __local const float *inv, float16 *act)
{
    for (int c8 = 0; c8 < n; c8 += 8)
        act[c8 / 8] = activate_gates8(g0, g1, c8, min(8, n - c8), inv);
}

/* swiglu: act * up into rows r, r + 1 */
__attribute__((always_inline)) inline void store_swiglus(const float16 *act, const float *u0, const float *u1, int n,
                                                        __local const float *inv, __global float *y, int r, int rows)
{
    for (int c8 = 0; c8 < n; c8 += 8)
        store_swiglu8(act[c8 / 8], u0, u1, c8, min(8, n - c8), inv, y + r, rows);
}

/* qkv: rows r, r + 1 of tokens t0.., rotated into the KV cache (rope_store) */
__attribute__((always_inline)) inline void store_qkv(const float *o0, const float *o1, int n, int r, int t0, __local const float *inv,
                                                    __global const int *pos, __global const int *seq, __global const int *tables,
                                                    int max_blocks, __global const float *rope, __global float *y,
                                                    __global half *kcache, __global half *vcache, int layer)
{
    for (int c = 0; c < n; c++) {
        const int t = t0 + c, p = pos[t];
        const int block = tables[seq[t] * max_blocks + p / BLOCK_SIZE];
        rope_store(r, (float2)(o0[c], o1[c]) * inv[c], t, p, block, rope, y, kcache, vcache, layer);
    }
}

/* The three fused kernels of one weight type and tile, as hooks fill them in:
 *   BEGIN(normalize)        starts the kernel (the RMS scales, then r, the row pair)
 *   TILE_BEGIN(TILE, norm.) starts each tile of columns c0..
 *   DOT(WTYPE, TILE, normalize, r0, r1, out0, out1)   rows r0, r1 times the tile
 * WGSIZE is the work-group size, EXTRA more kernel arguments (from a comma). Here the
 * hooks decode blocks to floats; cpu/lowbit.cl's quantize the inputs per tile. */
#define DEFINE_FUSED(NAME, WTYPE, TILE, WGSIZE, EXTRA, BEGIN, TILE_BEGIN, DOT)  \
__kernel __attribute__((reqd_work_group_size(WGSIZE, 1, 1)))                    \
void matmul_##NAME##_t##TILE(MATMUL_ARGS, int normalize, int accumulate EXTRA)  \
{                                                                               \
    BEGIN(normalize)                                                            \
    const int r1 = min(r + 1, rows - 1); /* an odd last row pairs with itself */ \
    for (int c0 = 0; c0 < ncols; c0 += TILE) {                                  \
        TILE_BEGIN(TILE, normalize)                                             \
        float o0[TILE], o1[TILE];                                               \
        DOT(WTYPE, TILE, normalize, r, r1, o0, o1);                             \
        store_rows(o0, o1, min(TILE, ncols - c0), r, r1, accumulate, inv + c0,  \
                   y + (size_t)c0 * rows, rows);                                \
    }                                                                           \
}                                                                               \
                                                                                \
__kernel __attribute__((reqd_work_group_size(WGSIZE, 1, 1)))                    \
void swiglu_##NAME##_t##TILE(MATMUL_ARGS EXTRA)                                 \
{                                                                               \
    BEGIN(1)                                                                    \
    for (int c0 = 0; c0 < ncols; c0 += TILE) {                                  \
        TILE_BEGIN(TILE, 1)                                                     \
        float g0[TILE], g1[TILE], u0[TILE], u1[TILE];                           \
        float16 act[(TILE + 7) / 8];                                            \
        DOT(WTYPE, TILE, 1, r, r + 1, g0, g1);                                  \
        activate_gates(g0, g1, min(TILE, ncols - c0), inv + c0, act);           \
        DOT(WTYPE, TILE, 1, rows + r, rows + r + 1, u0, u1);                    \
        store_swiglus(act, u0, u1, min(TILE, ncols - c0), inv + c0,             \
                      y + (size_t)c0 * rows, r, rows);                          \
    }                                                                           \
}                                                                               \
                                                                                \
__kernel __attribute__((reqd_work_group_size(WGSIZE, 1, 1)))                    \
void qkv_##NAME##_t##TILE(MATMUL_ARGS, __global const int *pos,                \
                          __global const int *seq, __global const int *tables,  \
                          int max_blocks, __global const float *rope,           \
                          __global half *kcache, __global half *vcache,         \
                          int layer EXTRA)                                      \
{                                                                               \
    BEGIN(1)                                                                    \
    /* a part of a split stack (gpu/weights.py) runs from its first row pair, the  \
       global offset: its own rows count from there, and rows is where it ends */ \
    const int w0 = r - 2 * (int)get_global_offset(0);                          \
    for (int c0 = 0; c0 < ncols; c0 += TILE) {                                  \
        TILE_BEGIN(TILE, 1)                                                     \
        float o0[TILE], o1[TILE];                                               \
        DOT(WTYPE, TILE, 1, w0, w0 + 1, o0, o1);                                \
        store_qkv(o0, o1, min(TILE, ncols - c0), r, c0, inv + c0, pos, seq,     \
                  tables, max_blocks, rope, y, kcache, vcache, layer);          \
    }                                                                           \
}

#define NO_ARGS
#define NO_TILE_BEGIN(TILE, normalize)
/* `scaled` a literal in each branch: a matmul without a norm skips g altogether */
#define BLOCK_DOT(WTYPE, TILE, normalize, r0, r1, out0, out1)                   \
    if (normalize)                                                              \
        pair_dot_tile(WTYPE, TILE, 1, qs, dm, g, x, xrows, r0, r1, k, c0, ncols, out0, out1); \
    else                                                                        \
        pair_dot_tile(WTYPE, TILE, 0, qs, dm, g, x, xrows, r0, r1, k, c0, ncols, out0, out1)

#define DEFINE_MATMUL(NAME, WTYPE, TILE) \
    DEFINE_FUSED(NAME, WTYPE, TILE, WG, NO_ARGS, MATMUL_PROLOGUE, NO_TILE_BEGIN, BLOCK_DOT)

#define DEFINE_MATMULS(NAME, WTYPE) \
    DEFINE_MATMUL(NAME, WTYPE, 1)   \
    DEFINE_MATMUL(NAME, WTYPE, 2)   \
    DEFINE_MATMUL(NAME, WTYPE, 4)   \
    DEFINE_MATMUL(NAME, WTYPE, 8)

/* the kinds no integer route reads: cpu/nibbles.cl takes the other 32-weight kinds
   (gpu/launches.py's NIBBLE_VARIANTS), cpu/lowbit.cl q2 and q3 */
#ifdef MATMUL_f32
DEFINE_MATMULS(f32, WT_F32)
#endif
#ifdef MATMUL_q8x2
DEFINE_MATMULS(q8x2, WT_Q8X2)
#endif
