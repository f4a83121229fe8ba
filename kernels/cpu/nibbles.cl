/* CPU family: 4-bit blocks (kind q4_1: Q4_0, Q4_1, Q4_K) times a batch of vectors in
 * integer arithmetic, in place of cpu/matmul.cl's float kernels for this kind. Built
 * after cpu/lowbit.cl (madd, ROUND, hmax_int16), whose scheme this follows.
 *
 * Decoding a block to floats took 19 instructions per row and block of 32 weights
 * (two nibble widenings, two conversions, the scale and offset, the products), and
 * at one or two columns nothing shares them: the batch-1 matmuls ran at 10-16 GB/s
 * of weights. Here the work-group quantizes each input column once, per group of 128
 * inputs, to 16-bit integers (rounding error at most 1/65534 of the group's largest
 * |x|), and a row reads four blocks at a time as they are stored:
 *     w . x = sum_b d_b (q_b . x_b) + m_b sum(x_b)
 * q_b . x_b by pairwise multiply-adds of 16-bit lanes (pmaddwd), 32 weights an
 * instruction, d_b once per block and m_b against the block's float input sum.
 *
 * The 64 bytes of four blocks, read as 32 16-bit lanes (8 a block), hold four nibbles
 * each: lane 8b + l holds bytes 2l, 2l + 1 of block b, whose nibbles are weights 2l,
 * 2l + 16, 2l + 1, 2l + 17 (quant.cl: byte j holds weights j and j + 16). Step f
 * takes nibble f of every lane, so the inputs are stored to match: step 0's lanes
 * 8b.. are the even inputs of the block's first half, step 1's the even of its second
 * half, step 2's and 3's the odd ones. A 32-bit lane of the sums (lanes 2u, 2u + 1)
 * stays within block u / 4. A row's last nb % 4 blocks are decoded as floats.
 * A column's sums are added in the same order at every tile width, so its results do
 * not depend on what else the batch holds (a wide tile only shares the decoding).
 */

#define NIB_GROUP 128  /* inputs (four blocks) per 16-bit quantization scale */

/* The local buffer, per column and group: a float16 of the blocks' input sums (a
   quarter of block b's in lanes 4b..4b + 3), four short32 of inputs (one per step),
   and the float scale, in three arrays. */
#define NIB_SUMS(xl, tile, ng) ((__local float16 *)(xl))
#define NIB_INPUTS(xl, tile, ng) ((__local short32 *)(NIB_SUMS(xl, tile, ng) + (tile) * (ng)))
#define NIB_SCALES(xl, tile, ng) ((__local float *)(NIB_INPUTS(xl, tile, ng) + 4 * (tile) * (ng)))

/* Columns c0.. c0 + tile - 1 of g * x (x when `normalize` is 0) into the local buffer,
   shared out over the work-group by (column, group); barriers as quantize_tile's. */
inline void quantize_nibble_tile(__global const float *x, __global const int *xrows, __global const float *g,
                                 int normalize, int k, int c0, int ncols, const int tile, __local uchar *xl)
{
    const int ng = k / NIB_GROUP;
    __local float16 *xs = NIB_SUMS(xl, tile, ng);
    __local short32 *xq = NIB_INPUTS(xl, tile, ng);
    __local float *xd = NIB_SCALES(xl, tile, ng);
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int u = get_local_id(0); u < tile * ng; u += get_local_size(0)) {
        const int c = u / ng, s = u % ng;
        __global const float *xc = x + (size_t)xrows[min(c0 + c, ncols - 1)] * k + NIB_GROUP * s;
        float16 v[8];
        int16 m = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            v[i] = normalize ? F16(i, xc) * F16(8 * s + i, g) : F16(i, xc);
            m = max(m, as_int16(v[i]) & 0x7fffffff);
        }
        const float amax = as_float(hmax_int16(m));
        const float to_int = amax > 0.0f ? 32767.0f / amax : 0.0f;
        short16 lo[4], hi[4];  /* block b's first and second halves, rounded */
        float sums[4];
#pragma unroll
        for (int b = 0; b < 4; b++) {
            lo[b] = convert_short16(ROUND(v[2 * b] * to_int));
            hi[b] = convert_short16(ROUND(v[2 * b + 1] * to_int));
            sums[b] = hsum16(v[2 * b] + v[2 * b + 1]) * 0.25f;
        }
        __local short32 *o = xq + ((size_t)c * ng + s) * 4;
        o[0] = (short32)(lo[0].even, lo[1].even, lo[2].even, lo[3].even);
        o[1] = (short32)(hi[0].even, hi[1].even, hi[2].even, hi[3].even);
        o[2] = (short32)(lo[0].odd, lo[1].odd, lo[2].odd, lo[3].odd);
        o[3] = (short32)(hi[0].odd, hi[1].odd, hi[2].odd, hi[3].odd);
        xs[c * ng + s] = (float16)((float4)(sums[0]), (float4)(sums[1]), (float4)(sums[2]), (float4)(sums[3]));
        xd[c * ng + s] = amax / 32767.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}

/* Four blocks of a row from block `blk`: the nibble lanes, and each block's d and m
   spread over its four 32-bit lanes. (Rows of 18 blocks start 32 bytes off a 64-byte
   line: the loads are 16- and 8-byte ones the compiler may join.) */
__attribute__((always_inline)) inline void read_nibbles(__global const uchar *qs, __global const float *dm,
        size_t blk, short32 *w, float16 *d, float16 *m)
{
    __global const uint4 *q = (__global const uint4 *)qs + blk;
    *w = __builtin_astype((uint16)(q[0], q[1], q[2], q[3]), short32);
    __global const float2 *s = (__global const float2 *)dm + blk;
    const float8 dms = (float8)(s[0], s[1], s[2], s[3]);
    *d = dms.s0000222244446666;
    *m = dms.s1111333355557777;
}

/* lane u: block u / 4's partial sum of quant * input */
#define NIBBLE(w, f) (((w) >> (short)(4 * (f))) & (short)15)
__attribute__((always_inline)) inline int16 nibble_dot(short32 w, __local const short32 *xv)
{
    return madd(NIBBLE(w, 0), xv[0]) + madd(NIBBLE(w, 1), xv[1]) + madd(NIBBLE(w, 2), xv[2]) + madd(NIBBLE(w, 3), xv[3]);
}

/* out0[c] = W[r0] . (g * x[c0+c]), out1[c] = W[r1] . (...), c < tile: the groups from
   the local buffer, the last nb % 4 blocks as pair_dot_tile does */
__attribute__((always_inline)) inline void pair_dot_nibbles(const int tile, __global const uchar *qs,
        __global const float *dm, __global const float *g, __global const float *x,
        __global const int *xrows, int normalize, int r0, int r1, int k, int c0, int ncols,
        __local uchar *xl, float *out0, float *out1)
{
    const int nb = k / 32, ng = k / NIB_GROUP;
    __local const float16 *xs = NIB_SUMS(xl, tile, ng);
    __local const short32 *xq = NIB_INPUTS(xl, tile, ng);
    __local const float *xd = NIB_SCALES(xl, tile, ng);
    float16 a0[MAX_TILE], a1[MAX_TILE];
    for (int c = 0; c < tile; c++)
        a0[c] = a1[c] = (float16)0.0f;
    for (int s = 0; s < ng; s++) {
        short32 w0, w1;
        float16 d0, d1, m0, m1;
        read_nibbles(qs, dm, (size_t)r0 * nb + 4 * s, &w0, &d0, &m0);
        read_nibbles(qs, dm, (size_t)r1 * nb + 4 * s, &w1, &d1, &m1);
        for (int c = 0; c < tile; c++) {
            const int at = c * ng + s;
            __local const short32 *xv = xq + (size_t)at * 4;
            const float dx = xd[at];
            const float16 sums = xs[at];
            a0[c] += convert_float16(nibble_dot(w0, xv)) * (d0 * dx) + m0 * sums;
            a1[c] += convert_float16(nibble_dot(w1, xv)) * (d1 * dx) + m1 * sums;
        }
    }
    for (int b = 4 * ng; b < nb; b++) {
        float16 lo0, hi0, lo1, hi1;
        load_block(WT_Q4_1, qs, dm, (size_t)r0 * nb + b, &lo0, &hi0);
        load_block(WT_Q4_1, qs, dm, (size_t)r1 * nb + b, &lo1, &hi1);
        const float16 glo = normalize ? F16(2 * b, g) : 1.0f, ghi = normalize ? F16(2 * b + 1, g) : 1.0f;
        for (int c = 0; c < tile; c++) {
            __global const float *xc = x + (size_t)xrows[min(c0 + c, ncols - 1)] * k;
            const float16 xlo = F16(2 * b, xc) * glo, xhi = F16(2 * b + 1, xc) * ghi;
            a0[c] += lo0 * xlo + hi0 * xhi;
            a1[c] += lo1 * xlo + hi1 * xhi;
        }
    }
    for (int c = 0; c < tile; c++) {
        out0[c] = hsum16(a0[c]);
        out1[c] = hsum16(a1[c]);
    }
}

/* cpu/matmul.cl's fused kernels with these hooks, as cpu/lowbit.cl's (kind "nib") */
#define NIBBLE_TILE_BEGIN(TILE, normalize)                                      \
    quantize_nibble_tile(x, xrows, g, normalize, k, c0, ncols, TILE, (__local uchar *)xl); \
    if (!active)                                                                \
        continue;
#define NIBBLE_DOT(WTYPE, TILE, normalize, r0, r1, out0, out1)                  \
    pair_dot_nibbles(TILE, qs, dm, g, x, xrows, normalize, r0, r1, k, c0, ncols, (__local uchar *)xl, out0, out1)

DEFINE_FUSED(nib, WT_Q4_1, 1, WG, LOWBIT_ARGS, LOWBIT_BEGIN, NIBBLE_TILE_BEGIN, NIBBLE_DOT)
DEFINE_FUSED(nib, WT_Q4_1, 2, WG, LOWBIT_ARGS, LOWBIT_BEGIN, NIBBLE_TILE_BEGIN, NIBBLE_DOT)
DEFINE_FUSED(nib, WT_Q4_1, 4, WG, LOWBIT_ARGS, LOWBIT_BEGIN, NIBBLE_TILE_BEGIN, NIBBLE_DOT)
DEFINE_FUSED(nib, WT_Q4_1, 8, WG, LOWBIT_ARGS, LOWBIT_BEGIN, NIBBLE_TILE_BEGIN, NIBBLE_DOT)
