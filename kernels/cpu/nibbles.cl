/* CPU family: blocks of 32 weights (kinds q4_1: Q4_0, Q4_1; q5: Q5_1, Q5_K; q6; q8_0: Q8_0
 * and stacks of symmetric 32-weight types; the compact q5_0, read with q5's bit scheme;
 * the compact q4_k and q6_k a super-block at a time, pair_dot_super_cols) times a batch of vectors
 * in integer arithmetic, in place of cpu/matmul.cl's float kernels for these kinds.
 * Built after cpu/lowbit.cl (madd, ROUND, hmax_int16), whose scheme this follows.
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
 * stays within block u / 4. A row of blocks past its last whole group reads them as
 * one more group, whose missing inputs are zeros (nib_groups).
 * q5 and q6 store the same nibbles, and their high bits (one a weight, two) in words
 * of the block's record: a constant multiply per lane moves a lane's bits to one place
 * (step_quants), so every step stays a few instructions, as in lowbit.cl. Q6_K's two
 * scales a block split its integer sum in halves (steps 0, 2 and 1, 3), and its quants
 * are centred (q - 32) in the integers, so it needs no input sums. q8_0's bytes are
 * read as 16-bit lanes, two steps a lane, each sign-extended in two instructions.
 * A column's sums are added in the same order at every tile width, so its results do
 * not depend on what else the batch holds (a wide tile only shares the decoding).
 */

#define NIB_GROUP 128  /* inputs (four blocks) per 16-bit quantization scale */
#define GEMM_TILE 32   /* the widest tile (gpu/launches.py) */

/* A column's groups of inputs. Where k is not a multiple of 128 (SmolLM2's 576: four
   groups and two blocks) the last is short: its inputs past k are quantized as zeros,
   and a row reads it as a whole group, the blocks past the row's end (the next row's;
   after the last row, the zero bytes of gpu/weights.py's READ_PAST) meeting those zeros,
   their finite scales times nothing. So a whole row stays in integer arithmetic: two
   blocks decoded as floats cost far more than their share of it. */
inline int nib_groups(int k)
{
    return (k + NIB_GROUP - 1) / NIB_GROUP;
}

/* The local buffer, per column and group: a float16 of the blocks' input sums (a
   quarter of block b's in lanes 4b..4b + 3; for a super-block, in its first group's,
   its eight blocks' whole sums twice over), four short32 of inputs (one per step), and
   the float scale, in three arrays. */
#define NIB_SUMS(xl, tile, ng) ((__local float16 *)(xl))
#define NIB_INPUTS(xl, tile, ng) ((__local short32 *)(NIB_SUMS(xl, tile, ng) + (tile) * (ng)))
#define NIB_SCALES(xl, tile, ng) ((__local float *)(NIB_INPUTS(xl, tile, ng) + 4 * (tile) * (ng)))

/* Columns c0.. c0 + tile - 1 of g * x (x when `normalize` is 0) into the local buffer,
   shared out over the work-group by (column, group). With
   `span` 2 (a literal), each pair of groups (256 inputs: a super-block of Q4_K or Q6_K)
   shares one scale, so a row's integer sums over the pair add up before one float. */
__attribute__((always_inline)) inline void quantize_nibble_columns(__global const float *x, __global const int *xrows, __global const float *g,
                                 int normalize, int k, int c0, int ncols, const int tile, const int span,
                                 __local uchar *xl)
{
    const int ng = nib_groups(k), units = ng / span;
    __local float16 *xs = NIB_SUMS(xl, tile, ng);
    __local short32 *xq = NIB_INPUTS(xl, tile, ng);
    __local float *xd = NIB_SCALES(xl, tile, ng);
    /* a wide tile's columns past the batch, rounded up to 8, are skipped (pair_dot_nibbles) */
    const int live = tile > MAX_TILE ? min(tile, (ncols - c0 + MAX_TILE - 1) / MAX_TILE * MAX_TILE) : tile;
    for (int u = get_local_id(0); u < live * units; u += get_local_size(0)) {
        const int c = u / units, s0 = u % units * span;
        __global const float *xc = x + (size_t)xrows[min(c0 + c, ncols - 1)] * k + NIB_GROUP * s0;
        float16 v[16];
        int16 m = 0;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            if (i < 8 * span && NIB_GROUP * s0 + 16 * i >= k) {
                v[i] = 0.0f;  /* past a short last group's inputs */
            } else if (i < 8 * span) {
                v[i] = normalize ? F16(i, xc) * F16(8 * s0 + i, g) : F16(i, xc);
                m = max(m, as_int16(v[i]) & 0x7fffffff);
            }
        }
        const float amax = as_float(hmax_int16(m));
        const float to_int = amax > 0.0f ? 32767.0f / amax : 0.0f;
        float8 blocks;  /* span 2: the super-block's block sums */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if (h < span) {
                short16 lo[4], hi[4];  /* block b's first and second halves, rounded */
                float sums[4];
#pragma unroll
                for (int b = 0; b < 4; b++) {
                    lo[b] = convert_short16(ROUND(v[8 * h + 2 * b] * to_int));
                    hi[b] = convert_short16(ROUND(v[8 * h + 2 * b + 1] * to_int));
                    sums[b] = hsum16(v[8 * h + 2 * b] + v[8 * h + 2 * b + 1]);
                }
                if (h == 0)
                    blocks.lo = (float4)(sums[0], sums[1], sums[2], sums[3]);
                else
                    blocks.hi = (float4)(sums[0], sums[1], sums[2], sums[3]);
                const int s = s0 + h;
                __local short32 *o = xq + ((size_t)c * ng + s) * 4;
                o[0] = (short32)(lo[0].even, lo[1].even, lo[2].even, lo[3].even);
                o[1] = (short32)(hi[0].even, hi[1].even, hi[2].even, hi[3].even);
                o[2] = (short32)(lo[0].odd, lo[1].odd, lo[2].odd, lo[3].odd);
                o[3] = (short32)(hi[0].odd, hi[1].odd, hi[2].odd, hi[3].odd);
                if (span == 1)
                    xs[c * ng + s] = (float16)((float4)(sums[0] * 0.25f), (float4)(sums[1] * 0.25f),
                                               (float4)(sums[2] * 0.25f), (float4)(sums[3] * 0.25f));
                xd[c * ng + s] = amax / 32767.0f;
            }
        }
        if (span == 2)
            xs[c * ng + s0] = (float16)(blocks, blocks);
    }
}

/* quantize_nibble_columns between barriers, as quantize_tile's (cpu/lowbit.cl) */
__attribute__((always_inline)) inline void quantize_nibble_tile(__global const float *x, __global const int *xrows, __global const float *g,
                                 int normalize, int k, int c0, int ncols, const int tile, const int span,
                                 __local uchar *xl)
{
    barrier(CLK_LOCAL_MEM_FENCE);
    quantize_nibble_columns(x, xrows, g, normalize, k, c0, ncols, tile, span, xl);
    barrier(CLK_LOCAL_MEM_FENCE);
}

typedef ushort ushort32 __attribute__((ext_vector_type(32)));
#define LANES4(v) (ushort32)(v, v, v, v)
/* a 32-bit lane's low (high) 16 bits in both its 16-bit lanes */
#define LOW_HALVES(u) (((u) & 0xffffu) | ((u) << 16))
#define HIGH_HALVES(u) (((u) >> 16) | ((u) & 0xffff0000u))

/* Four blocks of a row from block `blk`. Nibble kinds: the nibble lanes `w`, each
   block's d and m spread over its four 32-bit lanes (q6: the scales of its two halves),
   and for q5/q6 the high bits' words, a block's word in its 8 lanes: h0 for the block's
   first half (steps 0 and 2), h1 for its second. q5 keeps one word (weight j's bit at j):
   h0 is its low 16 bits, h1 its high. q6 keeps a word a half (weight j's two bits at 2j):
   lanes l < 4 of a block take its low 16 bits, l >= 4 its high, so weight 2l's bits are
   at 4 (l % 4). q8_0: `w` the blocks' first halves as 16-bit lanes (lane 8b + l: bytes
   2l, 2l + 1, the weights of steps 0 and 2), `w2` their second halves, d per block.
   (Rows of 18 blocks start 32 bytes off a 64-byte line: the loads are 16- and 8-byte
   ones the compiler may join.) */
/* Q4_K and Q6_K (compact kinds in whole super-blocks) are read by pair_dot_super_cols;
   compact Q5_0, whose rows may start half-way into a group of 8 blocks, by halves here */
#define SUPER_KIND(wtype) ((wtype) == WT_Q4_K || (wtype) == WT_Q6_K)
#define SUPER_BYTES(wtype) ((wtype) == WT_Q4_K ? Q4_K_GROUP : Q6_K_GROUP)  /* a group's qs */

/* q6's high-bit words (qh0, qh1 of four blocks) as the lanes of steps 0, 2 (h0) and 1, 3 (h1) */
__attribute__((always_inline)) inline void q6_high_lanes(uint8 words, ushort32 *h0, ushort32 *h1)
{
    const uint16 first = (uint16)(~0u, ~0u, 0u, 0u, ~0u, ~0u, 0u, 0u, ~0u, ~0u, 0u, 0u, ~0u, ~0u, 0u, 0u);
    const uint16 u0 = words.s0000222244446666, u1 = words.s1111333355557777;
    *h0 = __builtin_astype((LOW_HALVES(u0) & first) | (HIGH_HALVES(u0) & ~first), ushort32);
    *h1 = __builtin_astype((LOW_HALVES(u1) & first) | (HIGH_HALVES(u1) & ~first), ushort32);
}

/* Compact Q5_0's eight d of the group of 8 blocks holding block `blk`, decoded once for
   both its halves */
__attribute__((always_inline)) inline float8 q5_0_group_scales(__global const uchar *qs, size_t blk)
{
    return halves_to_float8(((__global const ushort8 *)(qs + (size_t)Q5_0_GROUP * (blk / 8) + 160))[0]);
}

/* (Compact Q5_0 takes its group's d, `group_d`, from q5_0_group_scales.) */
__attribute__((always_inline)) inline void read_nibbles(const int wtype, __global const uchar *qs,
        __global const float *dm, size_t blk, float8 group_d, short32 *w, short32 *w2, float16 *d, float16 *m,
        ushort32 *h0, ushort32 *h1)
{
    *h0 = *h1 = (ushort32)0;
    *w2 = (short32)0;
    if (wtype == WT_Q8_0) {
        __global const uint4 *q = (__global const uint4 *)qs + 2 * blk;
        *w = __builtin_astype((uint16)(q[0], q[2], q[4], q[6]), short32);
        *w2 = __builtin_astype((uint16)(q[1], q[3], q[5], q[7]), short32);
        *d = vload4(0, dm + blk).s0000111122223333;
        *m = (float16)0.0f;
        return;
    }
    if (wtype == WT_Q5_0) {
        /* blk is a multiple of 4 (host: rows of whole groups of four), so the four
           blocks are one half of a group of 8 */
        const int upper = (blk / 4) % 2;
        __global const uchar *group = qs + (size_t)Q5_0_GROUP * (blk / 8);
        __global const uint4 *q = (__global const uint4 *)group + 4 * upper;
        *w = __builtin_astype((uint16)(q[0], q[1], q[2], q[3]), short32);
        const uint4 u = ((__global const uint4 *)(group + 128))[upper];
        const float4 d4 = upper ? group_d.hi : group_d.lo;
        *d = d4.s0000111122223333;
        *m = -16.0f * *d;
        const uint16 u16 = u.s0000111122223333;
        *h0 = __builtin_astype(LOW_HALVES(u16), ushort32);
        *h1 = __builtin_astype(HIGH_HALVES(u16), ushort32);
        return;
    }
    __global const uint4 *q = (__global const uint4 *)qs + blk;
    *w = __builtin_astype((uint16)(q[0], q[1], q[2], q[3]), short32);
    if (wtype == WT_Q4_1) {
        __global const float2 *s = (__global const float2 *)dm + blk;
        const float8 dms = (float8)(s[0], s[1], s[2], s[3]);
        *d = dms.s0000222244446666;
        *m = dms.s1111333355557777;
        return;
    }
    __global const float4 *s = (__global const float4 *)dm + blk;
    const float16 dms = (float16)(s[0], s[1], s[2], s[3]);
    const uint16 words = as_uint16(dms);
    *d = dms.s000044448888cccc;
    *m = dms.s111155559999dddd;
    if (wtype == WT_Q5) {
        const uint16 u = words.s22226666aaaaeeee;
        *h0 = __builtin_astype(LOW_HALVES(u), ushort32);
        *h1 = __builtin_astype(HIGH_HALVES(u), ushort32);
    } else {
        q6_high_lanes(words.s2367abef, h0, h1);
    }
}

/* Step f's quant of every lane (f a literal): the nibble, with q5's fifth bit or q6's
   fifth and sixth, from a multiply by a power of two that moves lane l's bits 2l, 2l + 1
   (q5) to 14, 15, or its bits 4 (l % 4) .. + 3 (q6) to 12 .. 15 (one multiply serves
   the even and odd steps), q6's centred; q8_0's byte of the step, sign-extended. */
#define NIBBLE(w, f) (((w) >> (short)(4 * (f))) & (short)15)
#define Q5_MUL (ushort8)(16384, 4096, 1024, 256, 64, 16, 4, 1)
#define Q6_MUL (ushort8)(4096, 256, 16, 1, 4096, 256, 16, 1)
/* the compact kinds' quants are those of the kinds they pack the bytes of */
#define NIBBLE_SCHEME(wtype) ((wtype) == WT_Q4_K ? WT_Q4_1 : (wtype) == WT_Q5_0 ? WT_Q5 : (wtype))
__attribute__((always_inline)) inline short32 step_quants(int wtype, const int f, short32 w, short32 w2,
                                                          ushort32 h0, ushort32 h1)
{
    const ushort32 h = f % 2 ? h1 : h0;
    wtype = NIBBLE_SCHEME(wtype);
    if (wtype == WT_Q8_0) {
        const short32 v = f % 2 ? w2 : w;
        return f < 2 ? as_short32(__builtin_astype(v, ushort32) << (ushort)8) >> (short)8 : v >> (short)8;
    }
    if (wtype == WT_Q5)
        return NIBBLE(w, f) | as_short32(((h * LANES4(Q5_MUL)) >> (ushort)(f < 2 ? 10 : 11)) & (ushort)16);
    if (wtype == WT_Q6_K)  /* a lane's byte of high bits, step f's at 2f, moved to 4..5 */
        return (NIBBLE(w, f) | as_short32((f < 2 ? h << (ushort)(4 - 2 * f) : h >> (ushort)(2 * f - 4)) & (ushort)48)) - (short)32;
    if (wtype == WT_Q6)
        return (NIBBLE(w, f) | as_short32(((h * LANES4(Q6_MUL)) >> (ushort)(f < 2 ? 8 : 10)) & (ushort)48)) - (short)32;
    return NIBBLE(w, f);
}

/* lane u: block u / 4's partial sum of quant * input over one half of each block (the
   first for `second` 0, steps 0 and 2; else steps 1 and 3), added to `acc` */
__attribute__((always_inline)) inline int16 nibble_half_dot(const int wtype, const int second, short32 w, short32 w2,
        ushort32 h0, ushort32 h1, __local const short32 *xv, int16 acc)
{
    acc = madd_add(acc, step_quants(wtype, second, w, w2, h0, h1), xv[second]);
    return madd_add(acc, step_quants(wtype, second + 2, w, w2, h0, h1), xv[second + 2]);
}

/* out0[c] = W[r0] . (g * x[c0+c]), out1[c] = W[r1] . (...), c < tile: the groups from
   the local buffer (laid out for `layout` columns), a short last one too (nib_groups),
   into the accumulators a0 and a1 (`tile` of each) */
__attribute__((always_inline)) inline void pair_dot_nibble_cols(const int wtype, const int tile, const int layout,
        __global const uchar *qs, __global const float *dm, int r0, int r1, int k, __local uchar *xl,
        float16 *a0, float16 *a1, float *out0, float *out1)
{
    const int nb = k / 32, ng = nib_groups(k);
    __local const float16 *xs = NIB_SUMS(xl, layout, ng);
    __local const short32 *xq = NIB_INPUTS(xl, layout, ng);
    __local const float *xd = NIB_SCALES(xl, layout, ng);
    for (int c = 0; c < tile; c++)
        a0[c] = a1[c] = (float16)0.0f;
    for (int s = 0; s < ng; s++) {
        short32 w0, w1, v0, v1;
        float16 d0, d1, m0, m1;
        ushort32 h00, h01, h10, h11;
        const size_t b0 = (size_t)r0 * nb + 4 * s, b1 = (size_t)r1 * nb + 4 * s;
        prefetch_pair(qs, dm, r0, r1, nb, 4 * s, 4, QS_BYTES(wtype), DM_BYTES(wtype));
        /* compact Q5_0's group d, rows r0 and r1 (one vcvtph2ps: cheaper than a branch) */
        const float8 g0 = wtype == WT_Q5_0 ? q5_0_group_scales(qs, b0) : 0.0f;
        const float8 g1 = wtype == WT_Q5_0 ? q5_0_group_scales(qs, b1) : 0.0f;
        read_nibbles(wtype, qs, dm, b0, g0, &w0, &v0, &d0, &m0, &h00, &h01);
        read_nibbles(wtype, qs, dm, b1, g1, &w1, &v1, &d1, &m1, &h10, &h11);
        for (int c = 0; c < tile; c++) {
            const int at = c * ng + s;
            __local const short32 *xv = xq + (size_t)at * 4;
            const float dx = xd[at];
            if (NIBBLE_SCHEME(wtype) == WT_Q6) {  /* a scale a half, no offset */
                const int16 p0 = nibble_half_dot(wtype, 0, w0, v0, h00, h01, xv, 0), q0 = nibble_half_dot(wtype, 1, w0, v0, h00, h01, xv, 0);
                const int16 p1 = nibble_half_dot(wtype, 0, w1, v1, h10, h11, xv, 0), q1 = nibble_half_dot(wtype, 1, w1, v1, h10, h11, xv, 0);
                a0[c] += convert_float16(p0) * (d0 * dx) + convert_float16(q0) * (m0 * dx);
                a1[c] += convert_float16(p1) * (d1 * dx) + convert_float16(q1) * (m1 * dx);
                continue;
            }
            /* the halves in two chains of multiply-adds (scaled_super_dot says why) */
            const int16 i0 = nibble_half_dot(wtype, 0, w0, v0, h00, h01, xv, 0) + nibble_half_dot(wtype, 1, w0, v0, h00, h01, xv, 0);
            const int16 i1 = nibble_half_dot(wtype, 0, w1, v1, h10, h11, xv, 0) + nibble_half_dot(wtype, 1, w1, v1, h10, h11, xv, 0);
            if (wtype == WT_Q8_0) {  /* no offset */
                a0[c] += convert_float16(i0) * (d0 * dx);
                a1[c] += convert_float16(i1) * (d1 * dx);
            } else {
                const float16 sums = xs[at];
                a0[c] += convert_float16(i0) * (d0 * dx) + m0 * sums;
                a1[c] += convert_float16(i1) * (d1 * dx) + m1 * sums;
            }
        }
    }
    for (int c = 0; c < tile; c++) {
        out0[c] = hsum16(a0[c]);
        out1[c] = hsum16(a1[c]);
    }
}

/* Q4_K's and Q6_K's super-blocks, as llama.cpp's CPU kernels take them: their sub-block
 * scales stay integers (6-bit, int8), each block's integer dot product is multiplied by its
 * scale in the integers, and a row's sums over the super-block (256 inputs, one input scale:
 * quantize_nibble_tile's span 2) become one float, times d: one conversion a super-block where
 * the float per block took four multiply-adds a half. Q4_K's mins meet the blocks' float input
 * sums. The integer sums cannot overflow: Q4_K's lanes hold at most 2 * 8 * 15 * 32767 * 63
 * (< 2^29), Q6_K's 4 * 4 * 32 * 32767 * 128 (< 2^31: |q - 32| <= 32, |scale| <= 128).
 *
 * A row's group: its two halves' nibble lanes `w`, q6_k's high bits `h` (a lane's byte in
 * each 16-bit lane, h[half], gathered from the layout's four a nibble byte), the integer scales of each half's lanes `sa` (q6_k:
 * of their first 16 weights, `sb` of the second), q4_k's blocks' float mins (times -dmin), and d. */
__attribute__((always_inline)) inline void read_super_group(const int wtype, __global const uchar *qs,
        __global const float *dm, size_t grp, short32 *w, ushort32 *h, int16 *sa, int16 *sb, float8 *mins, float *d)
{
    if (wtype == WT_Q4_K) {
        __global const uint4 *q = (__global const uint4 *)(qs + (size_t)Q4_K_GROUP * grp);
        w[0] = __builtin_astype((uint16)(q[0], q[2], q[1], q[3]), short32);  /* (GROUP_SLOT) */
        w[1] = __builtin_astype((uint16)(q[4], q[6], q[5], q[7]), short32);
        const uint4 head = q[8];
        const int16 fields = q4_k_fields(head);
        const float2 dd = halves_to_float8(as_ushort8(head)).s01;
        sa[0] = fields.s0000111122223333;
        sa[1] = fields.s4444555566667777;
        *mins = convert_float8(fields.hi) * -dd.y;
        *d = dd.x;
        return;
    }
    __global const uint4 *q = (__global const uint4 *)(qs + (size_t)Q6_K_GROUP * grp);
    w[0] = __builtin_astype((uint16)(q[0], q[2], q[1], q[3]), short32);  /* (GROUP_SLOT) */
    w[1] = __builtin_astype((uint16)(q[4], q[6], q[5], q[7]), short32);
#pragma unroll
    for (int i = 0; i < 2; i++) {
        /* lane l of a half group: the high bits of its nibble bytes 2l and 2l + 1 (quant.cl:
           a byte's low four bits for the half's first 32, its high four for the rest), then
           its blocks in order, as w's */
        const ushort16 u = __builtin_astype((uint8)(q[8 + 2 * i], q[9 + 2 * i]), ushort16);
        const ushort32 slots = (ushort32)((u & (ushort)0x0f) | ((u >> (ushort)4) & (ushort)0xf0),
                                          ((u >> (ushort)4) & (ushort)0x0f) | ((u >> (ushort)8) & (ushort)0xf0));
        h[i] = __builtin_astype(__builtin_shufflevector(__builtin_astype(slots, ulong8), __builtin_astype(slots, ulong8),
                                                        0, 1, 4, 5, 2, 3, 6, 7), ushort32);
    }
    const int16 sc = convert_int16(as_char16(q[12]));
    sa[0] = sc.s0000222244446666;
    sb[0] = sc.s1111333355557777;
    sa[1] = sc.s8888aaaacccceeee;
    sb[1] = sc.s9999bbbbddddffff;
    *d = halves_to_float8((ushort8)(((__global const ushort *)dm)[grp])).s0;
}

/* lane u: block u / 4's integer sum over a row's super-block, its scales applied */
__attribute__((always_inline)) inline int16 super_dot(const int wtype, const short32 *w, const ushort32 *h,
        const int16 *sa, const int16 *sb, __local const short32 *xv)
{
    int16 sum = 0;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const short32 none = 0;
        const ushort32 no_bits = 0;
        if (wtype == WT_Q4_K) {
            sum += sa[i] * nibble_half_dot(wtype, 1, w[i], none, no_bits, no_bits, xv + 4 * i,
                                              nibble_half_dot(wtype, 0, w[i], none, no_bits, no_bits, xv + 4 * i, 0));
        } else {
            sum += sa[i] * nibble_half_dot(wtype, 0, w[i], none, h[i], h[i], xv + 4 * i, 0)
                 + sb[i] * nibble_half_dot(wtype, 1, w[i], none, h[i], h[i], xv + 4 * i, 0);
        }
    }
    return sum;
}

/* A row's super-block quants with their sub-block scales applied, q[4 i + f] for step f of
 * half i (16-bit products: Q4_K's at most 15 * 63, Q6_K's 32 * 128), for a tile of two or
 * more columns: super_dot scales each column's sums (a 32-bit multiply per half, or two,
 * per row and column), where these take a 16-bit one per step once for every column. The
 * integer sums are the same, so a column's bits do not depend on which a tile takes. */
__attribute__((always_inline)) inline void scale_super_quants(const int wtype, const short32 *w, const ushort32 *h,
        const int16 *sa, const int16 *sb, short32 *q)
{
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const short32 none = 0;
        const uint16 ua = as_uint16(sa[i]), ub = as_uint16(wtype == WT_Q4_K ? sa[i] : sb[i]);
        const short32 a = __builtin_astype((ua & 0xffffu) | (ua << 16), short32);
        const short32 b = __builtin_astype((ub & 0xffffu) | (ub << 16), short32);
#pragma unroll
        for (int f = 0; f < 4; f++)  /* Q6_K: steps 0 and 2 are a block's first 16 weights */
            q[4 * i + f] = step_quants(wtype, f, w[i], none, h[i], h[i]) * (f % 2 ? b : a);
    }
}

/* lane u: block u / 4's integer sum over a row's super-block, from scale_super_quants' q,
   in two chains of multiply-adds (even and odd steps) added at the end: each vpdpwssd waits
   for the one before it on its sum, and integer adds give the same bits in any order */
__attribute__((always_inline)) inline int16 scaled_super_dot(const short32 *q, __local const short32 *xv)
{
    int16 even = 0, odd = 0;
#pragma unroll
    for (int f = 0; f < 8; f += 2) {
        even = madd_add(even, q[f], xv[f]);
        odd = madd_add(odd, q[f + 1], xv[f + 1]);
    }
    return even + odd;
}

/* acc plus a column's super-block for a row pair: each row's integer sums (scales applied)
   added in pairs of lanes, in the integers where `integer_pairs` says they cannot overflow,
   else as floats; times d and the column's input step `xd`, and for Q4_K its mins times the
   blocks' input sums `xs` */
__attribute__((always_inline)) inline float16 add_super_sums(const int wtype, const int integer_pairs, float16 acc,
        int16 i0, int16 i1, float16 d, float16 mins, float16 xd, float16 xs)
{
    const uint16 even = (uint16)(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30), odd = even + 1;
    const float16 sums = integer_pairs
        ? convert_float16(shuffle2(i0, i1, even) + shuffle2(i0, i1, odd))
        : shuffle2(convert_float16(i0), convert_float16(i1), even) + shuffle2(convert_float16(i0), convert_float16(i1), odd);
    return wtype == WT_Q4_K ? acc + (sums * (d * xd) + mins * xs) : acc + sums * (d * xd);
}

/* pair_dot_nibble_cols for Q4_K and Q6_K (rows of whole super-blocks). A column's
 * accumulator holds both rows, r0's in lanes 0..7 and r1's in 8..15: each row's sums are
 * added in pairs of lanes (its scales are in them already), so the super-block's d and Q4_K's
 * mins take one vector multiply-add for the two rows, not one a row. */
__attribute__((always_inline)) inline void pair_dot_super_cols(const int wtype, const int tile, const int layout,
        __global const uchar *qs, __global const float *dm, int r0, int r1, int k, __local uchar *xl,
        float16 *acc, float *out0, float *out1)
{
    const int ng = nib_groups(k), nsuper = k / 256;
    __local const float16 *xs = NIB_SUMS(xl, layout, ng);
    __local const short32 *xq = NIB_INPUTS(xl, layout, ng);
    __local const float *xd = NIB_SCALES(xl, layout, ng);
    for (int c = 0; c < tile; c++)
        acc[c] = (float16)0.0f;
    for (int j = 0; j < nsuper; j++) {
        short32 w0[2], w1[2];
        ushort32 h0[2], h1[2];
        int16 sa0[2], sb0[2], sa1[2], sb1[2];
        float8 m0 = 0.0f, m1 = 0.0f;
        float d0, d1;
        prefetch_run(qs + paired_group(r0, nsuper, j) * SUPER_BYTES(wtype), 2 * SUPER_BYTES(wtype));
        read_super_group(wtype, qs, dm, paired_group(r0, nsuper, j), w0, h0, sa0, sb0, &m0, &d0);
        read_super_group(wtype, qs, dm, paired_group(r1, nsuper, j), w1, h1, sa1, sb1, &m1, &d1);
        const float16 d = (float16)((float8)(d0), (float8)(d1)), mins = (float16)(m0, m1);
        short32 q0[8], q1[8];
        if (tile > 1) {
            scale_super_quants(wtype, w0, h0, sa0, sb0, q0);
            scale_super_quants(wtype, w1, h1, sa1, sb1, q1);
        }
        for (int c = 0; c < tile; c++) {
            const int at = c * ng + 2 * j;  /* the super-block's first group of inputs */
            __local const short32 *xv = xq + (size_t)at * 4;
            const int16 i0 = tile > 1 ? scaled_super_dot(q0, xv) : super_dot(wtype, w0, h0, sa0, sb0, xv);
            const int16 i1 = tile > 1 ? scaled_super_dot(q1, xv) : super_dot(wtype, w1, h1, sa1, sb1, xv);
            /* Q4_K's pairs add in the integers (below 2^30); Q6_K's lanes may reach 2^31 */
            acc[c] = add_super_sums(wtype, wtype == WT_Q4_K, acc[c], i0, i1, d, mins, (float16)xd[at], xs[at]);
        }
    }
    for (int c = 0; c < tile; c++) {
        out0[c] = hsum8(acc[c].lo);
        out1[c] = hsum8(acc[c].hi);
    }
}

/* INT8_INPUTS=1 (the host's default; SLOTSWARM_INT8=0 in gpu/families.py turns it off): Q4_K
 * and Q6_K on 8-bit inputs, much as llama.cpp takes them, and with INT8_NIBBLES=1 too
 * (SLOTSWARM_INT8=all) Q4_0 and Q4_1 (kind q4_1). A row and super-block takes four vpdpbusd
 * where 16-bit inputs take eight vpdpwssd, and prompts and batches are bound by those (on
 * AVX2, batch 1 too); the price is an input rounded by up to half a step of about 1/127 of its
 * block's largest |x| (quantize_super_bytes, quantize_group_columns), not 1/65534 of its
 * group's. On Q4_1 SmolLM2-135M's answers move with it (README), so Q4_0 and Q4_1 take 8-bit
 * inputs only when asked. */
#ifndef INT8_INPUTS
#define INT8_INPUTS 0
#endif
#ifndef INT8_NIBBLES
#define INT8_NIBBLES 0
#endif

/* A column's inputs to Q4_K and Q6_K on 8-bit inputs: a record a super-block, 384 bytes
   where the 16-bit groups take 648. A tile's records lie super-block by super-block, the
   live columns' records of each together (SUPER_RECORD), so a row pair's pass over them is
   one run of bytes; a column's staged records one after another. The steps and sums are in
   the lanes of the row pair's sums (pair_lanes), so a column's loop loads them as they are. */
typedef struct {
    uint16 quants[4];  /* vector i holds inputs 8i..8i + 7 of each block, block b's at byte 8b */
    float16 steps;     /* each block's step, block 2m + p's in lanes 4m + p and 4m + 2 + p */
    union {
        float16 floats;  /* Q4_K: each block's float input sum, in the lanes of its step */
        short32 halves;  /* Q6_K: each block's sums of its halves' quants, a 32-bit lane as its step's */
    } sums;
} SuperRecord;

/* column c's record of super-block j in a tile of `live` columns */
#define SUPER_RECORD(records, live, c, j) ((records) + (size_t)(j) * (live) + (c))

/* A column's inputs to Q4_0 and Q4_1 on 8-bit inputs: a record a group of four blocks, a
   column's records one after another, 256 bytes a group where 16 bits take 324. */
typedef struct {
    uint16 quants[2];  /* block b's inputs 0..15 at bytes 16b.. of the first, 16..31 of the second */
    float16 steps;     /* block b's step in lanes 4b..4b + 3 */
    float16 sums;      /* half block b's float input sum in lanes 4b..4b + 3 */
} GroupRecord;

/* How a kind's inputs are laid out, locally and staged */
#define NO_RECORDS 0     /* groups of 128 in 16 bits (NIB_SUMS, NIB_INPUTS, NIB_SCALES) */
#define SUPER_RECORDS 1  /* SuperRecords (Q4_K and Q6_K with INT8_INPUTS) */
#define GROUP_RECORDS 2  /* GroupRecords (Q4_0 and Q4_1 with INT8_INPUTS and INT8_NIBBLES) */

#if INT8_INPUTS

#define BLOCK_STEPS 8  /* the finest step a block may take: 1/8 of its super-block's */

/* quantize_nibble_tile for Q4_K and Q6_K with INT8_INPUTS (pair_dot_super_bytes): a super-block
   of 256 inputs to 8-bit integers, block b's in steps of u m_b: u is 1/BLOCK_STEPS of the step
   the super-block's largest |x| would give all of it (llama.cpp's Q8_K) and m_b (1..BLOCK_STEPS)
   the least its own largest |x| allows, so a block far below its super-block's largest keeps a
   finer step. Column c's super-block j goes to SUPER_RECORD, its bytes where they meet
   the quants of a row's super-block (read_q4_k_quants, read_q6_k_quants), and `wtype`'s sums. */
__attribute__((always_inline)) inline void quantize_super_columns(__global const float *x, __global const int *xrows, __global const float *g,
                                 int normalize, int k, int c0, int ncols, const int tile, const int wtype,
                                 __local uchar *xl)
{
    const int nsuper = k / 256;
    const int live = tile > MAX_TILE ? min(tile, (ncols - c0 + MAX_TILE - 1) / MAX_TILE * MAX_TILE) : tile;
    for (int u = get_local_id(0); u < live * nsuper; u += get_local_size(0)) {
        const int c = u / nsuper, j = u % nsuper;
        __global const float *xc = x + (size_t)xrows[min(c0 + c, ncols - 1)] * k + 256 * j;
        float16 v[16];  /* v[2b], v[2b + 1]: block b's halves */
        int16 magnitude[8];  /* block b's |x| as ordered integers, lane by lane */
#pragma unroll
        for (int b = 0; b < 8; b++) {
            v[2 * b] = normalize ? F16(2 * b, xc) * F16(16 * j + 2 * b, g) : F16(2 * b, xc);
            v[2 * b + 1] = normalize ? F16(2 * b + 1, xc) * F16(16 * j + 2 * b + 1, g) : F16(2 * b + 1, xc);
            magnitude[b] = max(as_int16(v[2 * b]) & 0x7fffffff, as_int16(v[2 * b + 1]) & 0x7fffffff);
        }
        /* the eight blocks' largest |x| at once: halving every block's lanes a level */
        int16 pairs[4], quads[2];
#pragma unroll
        for (int b = 0; b < 4; b++)
            pairs[b] = max((int16)(magnitude[2 * b].lo, magnitude[2 * b + 1].lo), (int16)(magnitude[2 * b].hi, magnitude[2 * b + 1].hi));
#pragma unroll
        for (int b = 0; b < 2; b++)
            quads[b] = max((int16)(pairs[2 * b].even, pairs[2 * b + 1].even), (int16)(pairs[2 * b].odd, pairs[2 * b + 1].odd));
        const int16 eights = max((int16)(quads[0].even, quads[1].even), (int16)(quads[0].odd, quads[1].odd));
        const float8 block_max = as_float8(max(eights.even, eights.odd));
        const float amax = as_float(hmax_int16((int16)(as_int8(block_max), as_int8(block_max))));
        const float8 steps = amax > 0.0f ? clamp(ceil((float)BLOCK_STEPS * block_max / amax), 1.0f, (float)BLOCK_STEPS) : 1.0f;
        const float8 to_int = amax > 0.0f ? (127.0f * BLOCK_STEPS) / (amax * steps) : 0.0f;
        __local SuperRecord *record = SUPER_RECORD((__local SuperRecord *)xl, live, c, j);
        const float unit = amax / (127.0f * BLOCK_STEPS);
        __local char8 *o = (__local char8 *)record->quants;
        float sums[8];
        short16 halves;  /* block b's halves' quant sums in lanes 2b, 2b + 1 */
#pragma unroll
        for (int b = 0; b < 8; b++) {
            const int16 first = ROUND(v[2 * b] * to_int[b]), second = ROUND(v[2 * b + 1] * to_int[b]);
            o[b] = convert_char8(first.lo);
            o[8 + b] = convert_char8(first.hi);
            o[16 + b] = convert_char8(second.lo);
            o[24 + b] = convert_char8(second.hi);
            if (wtype == WT_Q4_K) {
                sums[b] = hsum16(v[2 * b] + v[2 * b + 1]);
            } else {  /* (exact: at most 16 * 127) */
                halves[2 * b] = (short)hsum16(convert_float16(first));
                halves[2 * b + 1] = (short)hsum16(convert_float16(second));
            }
        }
        record->steps = (steps * unit).s0101232345456767;
        if (wtype == WT_Q4_K)
            record->sums.floats = ((float8)(sums[0], sums[1], sums[2], sums[3], sums[4], sums[5], sums[6], sums[7])).s0101232345456767;
        else
            record->sums.halves = as_short32(as_int8(halves).s0101232345456767);
    }
}

/* quantize_super_columns between the work-group's barriers */
__attribute__((always_inline)) inline void quantize_super_bytes(__global const float *x, __global const int *xrows, __global const float *g,
                                 int normalize, int k, int c0, int ncols, const int tile, const int wtype,
                                 __local uchar *xl)
{
    barrier(CLK_LOCAL_MEM_FENCE);
    quantize_super_columns(x, xrows, g, normalize, k, c0, ncols, tile, wtype, xl);
    barrier(CLK_LOCAL_MEM_FENCE);
}

/* lane u: acc + the sum of u's four products of unsigned bytes (`u8`) and signed ones (`s8`):
   one vpdpbusd where the host says the CPU has VNNI at the kernels' width (cpu/lowbit.cl's
   VNNI_WIDTH says how), else pmaddubsw's pairs (no pair here comes near its 16-bit
   saturation: at most 2 * 63 * 127) added by pmaddwd. The integer sums are the same bits
   either way. */
inline int16 dot_bytes(int16 acc, uint16 u8, uint16 s8)
{
#if VNNI_WIDTH == 512
    typedef int v16i __attribute__((__vector_size__(64)));
    v16i s = __builtin_astype(acc, v16i);
    __asm__("vpdpbusd %2, %1, %0" : "+v"(s) : "v"(__builtin_astype(u8, v16i)), "v"(__builtin_astype(s8, v16i)));
    return __builtin_astype(s, int16);
#elif VNNI_WIDTH == 256
    typedef int v8i __attribute__((__vector_size__(32)));
    v8i lo = __builtin_astype(acc.lo, v8i), hi = __builtin_astype(acc.hi, v8i);
    __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(lo) : "x"(__builtin_astype(u8.lo, v8i)), "x"(__builtin_astype(s8.lo, v8i)));
    __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(hi) : "x"(__builtin_astype(u8.hi, v8i)), "x"(__builtin_astype(s8.hi, v8i)));
    return (int16)(__builtin_astype(lo, int8), __builtin_astype(hi, int8));
#elif MADD_WIDTH == 512
    typedef char v64c __attribute__((__vector_size__(64)));
    typedef short v32s __attribute__((__vector_size__(64)));
    const v32s pairs = __builtin_ia32_pmaddubsw512((v64c)__builtin_astype(u8, v32s), (v64c)__builtin_astype(s8, v32s));
    return acc + madd(__builtin_astype(pairs, short32), (short32)1);
#elif MADD_WIDTH == 256
    typedef char v32c __attribute__((__vector_size__(32)));
    typedef short v16s __attribute__((__vector_size__(32)));
    const v16s lo = __builtin_ia32_pmaddubsw256((v32c)__builtin_astype(u8.lo, v16s), (v32c)__builtin_astype(s8.lo, v16s));
    const v16s hi = __builtin_ia32_pmaddubsw256((v32c)__builtin_astype(u8.hi, v16s), (v32c)__builtin_astype(s8.hi, v16s));
    return acc + madd((short32)(__builtin_astype(lo, short16), __builtin_astype(hi, short16)), (short32)1);
#else
    const short32 s = __builtin_astype(s8, short32);
    const short32 u_even = __builtin_astype(u8 & 0x00ff00ffu, short32), u_odd = __builtin_astype((u8 >> 8) & 0x00ff00ffu, short32);
    return acc + madd(u_even, (s << (short)8) >> (short)8) + madd(u_odd, s >> (short)8);
#endif
}

/* dot_bytes with the signed bytes read from local memory where an AVX-VNNI vpdpbusd takes
   them: a memory operand, where one in a register had the compiler store and reload copies
   of a column's inputs, the row pair's quants taking most of AVX2's 16 registers */
inline int16 dot_bytes_from(int16 acc, uint16 u8, __local const uint16 *s8)
{
#if VNNI_WIDTH == 256
    typedef int v8i __attribute__((__vector_size__(32)));
    __local const v8i *halves = (__local const v8i *)s8;
    v8i lo = __builtin_astype(acc.lo, v8i), hi = __builtin_astype(acc.hi, v8i);
    __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(lo) : "x"(__builtin_astype(u8.lo, v8i)), "m"(halves[0]));
    __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(hi) : "x"(__builtin_astype(u8.hi, v8i)), "m"(halves[1]));
    return (int16)(__builtin_astype(lo, int8), __builtin_astype(hi, int8));
#else
    return dot_bytes(acc, u8, *s8);
#endif
}

/* AVX2 without VNNI has pmaddubsw but no vpdpbusd, and a dot_bytes costs it twice the
   multiplies of a pmaddubsw alone: where a sum of byte products stays within 16 bits, the
   pairs are added as they are (bytes_pairs) and each row's lanes folded by a pairwise add of
   16-bit lanes (halves_pairs), into the lanes pack_halves leaves. The integer sums are the
   same. */
#define SHORT_SUMS (MADD_WIDTH == 256 && VNNI_WIDTH == 0)
#if SHORT_SUMS

/* lane l: u8's bytes 2l, 2l + 1 times s8's, added (pmaddubsw) */
inline short32 bytes_pairs(uint16 u8, uint16 s8)
{
    typedef char v32c __attribute__((__vector_size__(32)));
    typedef short v16s __attribute__((__vector_size__(32)));
    const v16s lo = __builtin_ia32_pmaddubsw256((v32c)__builtin_astype(u8.lo, v16s), (v32c)__builtin_astype(s8.lo, v16s));
    const v16s hi = __builtin_ia32_pmaddubsw256((v32c)__builtin_astype(u8.hi, v16s), (v32c)__builtin_astype(s8.hi, v16s));
    return (short32)(__builtin_astype(lo, short16), __builtin_astype(hi, short16));
}

/* in each 128 bits, a's four sums of neighbouring lanes, then b's four (vphaddw), as
   pack_halves lays out the 32-bit lanes those sums would have made */
inline short32 halves_pairs(short32 a, short32 b)
{
    typedef short v16s __attribute__((__vector_size__(32)));
    const v16s lo = __builtin_ia32_phaddw256(__builtin_astype(a.lo, v16s), __builtin_astype(b.lo, v16s));
    const v16s hi = __builtin_ia32_phaddw256(__builtin_astype(a.hi, v16s), __builtin_astype(b.hi, v16s));
    return (short32)(__builtin_astype(lo, short16), __builtin_astype(hi, short16));
}
#endif

/* a's and b's lanes, each within 16 bits, as vpackssdw interleaves them: in each 128 bits,
   four of a's, then four of b's */
inline short32 pack_halves(int16 a, int16 b)
{
#if MADD_WIDTH == 512
    typedef int v16i __attribute__((__vector_size__(64)));
    typedef short v32s __attribute__((__vector_size__(64)));
    return __builtin_astype(__builtin_ia32_packssdw512(__builtin_astype(a, v16i), __builtin_astype(b, v16i)), short32);
#elif MADD_WIDTH == 256
    typedef int v8i __attribute__((__vector_size__(32)));
    const v8i lo = __builtin_astype(__builtin_ia32_packssdw256(__builtin_astype(a.lo, v8i), __builtin_astype(b.lo, v8i)), v8i);
    const v8i hi = __builtin_astype(__builtin_ia32_packssdw256(__builtin_astype(a.hi, v8i), __builtin_astype(b.hi, v8i)), v8i);
    return (short32)(__builtin_astype(lo, short16), __builtin_astype(hi, short16));
#else
    return __builtin_convertvector(__builtin_shufflevector(a, b, 0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23,
                                                           8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31), short32);
#endif
}

/* Q4_K's and Q6_K's super-blocks against 8-bit inputs (quantize_super_bytes), much as llama.cpp's
 * CPU kernels take them: a 32-bit lane sums four byte products (vpdpbusd, 64 weights an
 * instruction), each block half's sums are multiplied by its integer sub-block scale in a
 * pmaddwd, and a row's sums over each block become one float, times d and the block's input
 * step. Q4_K's mins meet the blocks' float input sums.
 *
 * A row's super-block as four registers of 64 bytes, `q`, vector i holding weights 8i..8i + 7
 * of each block, block b's at byte 8b, as the inputs' records hold theirs (the device layout
 * holds a block's halves 16 bytes apart: eight-byte runs trade places, once a row for all the
 * tile's columns). A vpdpbusd lane then stays within a block, lanes 2b and 2b + 1 block b's, and
 * a pack_halves of the row pair's lanes and a pmaddwd by their scales leave a lane one block of
 * one row: every 128 bits blocks 2m and 2m + 1 of row 0, then of row 1 (pair_lanes).
 *
 * Q4_K's quants (0..15) are the unsigned operand, against signed inputs, and a row's four
 * vpdpbusd add up in one register before the pack: a lane sums at most 16 products of
 * 15 * 127. Q6_K's, with their two high bits, are unsigned too (0..63, as stored), and
 * `offsets` takes away the 32 they stand above: -32 times each half-block's scale against the
 * inputs' sums of its quants (the records' sums.halves), one pmaddwd a column. A vpdpbusd's
 * lanes may reach four products of 63 * 127, so each is packed on its own, by the scales of
 * its blocks' first halves (vectors 0, 1) or second (2, 3). The 32-bit sums stay below 2^27.
 */
typedef struct {
    uint16 q0[4], q1[4];  /* the two rows' quants */
    short32 scales[2];    /* the sub-block scales in pack_halves' lanes (Q4_K: one a block) */
    short32 offsets;      /* Q6_K: -32 times the scales of a block's two halves, a 32-bit lane a block, as pair_lanes' */
    float16 d, mins;      /* each lane's row's d, and Q4_K's its block's min times its dmin */
} RowPair;

/* A row's group's blocks in runs of 8 bytes, from vectors whose qwords are each block's
   two halves' runs one after the other, the blocks in GROUP_SLOT's order: the first run of
   every block, in order, is what AVX2's vpunpcklqdq makes of each 256 bits' qwords (0, 4,
   2, 6: slots 0, 2, 1, 3 hold blocks 0, 1, 2, 3), the second what vpunpckhqdq makes */
#define BLOCK_RUNS_EVEN (ulong8)(0, 4, 2, 6, 8, 12, 10, 14)

__attribute__((always_inline)) inline void block_runs(uint16 *q)
{
    const ulong8 a = as_ulong8(q[0]), b = as_ulong8(q[1]), c = as_ulong8(q[2]), d = as_ulong8(q[3]);
    q[0] = as_uint16(shuffle2(a, c, BLOCK_RUNS_EVEN));
    q[1] = as_uint16(shuffle2(a, c, BLOCK_RUNS_EVEN + 1));
    q[2] = as_uint16(shuffle2(b, d, BLOCK_RUNS_EVEN));
    q[3] = as_uint16(shuffle2(b, d, BLOCK_RUNS_EVEN + 1));
}

/* Q4_K's quants in block runs */
__attribute__((always_inline)) inline void read_q4_k_quants(__global const uchar *qs, size_t grp, uint16 *q)
{
    __global const uint4 *p = (__global const uint4 *)(qs + (size_t)Q4_K_GROUP * grp);
    /* (the runs trade places before the nibbles part: two shuffles a row, not four) */
    const ulong8 first = as_ulong8((uint16)(p[0], p[1], p[2], p[3])), second = as_ulong8((uint16)(p[4], p[5], p[6], p[7]));
    const uint16 even = as_uint16(shuffle2(first, second, BLOCK_RUNS_EVEN));
    const uint16 odd = as_uint16(shuffle2(first, second, BLOCK_RUNS_EVEN + 1));
    q[0] = even & 0x0f0f0f0fu;
    q[1] = odd & 0x0f0f0f0fu;
    q[2] = (even >> 4) & 0x0f0f0f0fu;
    q[3] = (odd >> 4) & 0x0f0f0f0fu;
}

/* A Q4_K row pair's scales, mins and d (q4_k_fields' fields) from both rows' heads at
   once, straight into pair_lanes' lanes: 32-bit lane 4m + 2r + p row r's block 2m + p
   (its scale in both 16-bit halves) */
__attribute__((always_inline)) inline void read_q4_k_heads(__global const uchar *qs, size_t grp0, size_t grp1, RowPair *rows)
{
    const uint4 h0 = ((__global const uint4 *)(qs + (size_t)Q4_K_GROUP * grp0))[8];
    const uint4 h1 = ((__global const uint4 *)(qs + (size_t)Q4_K_GROUP * grp1))[8];
    const uchar16 b0 = as_uchar16(h0), b1 = as_uchar16(h1);
    /* lane L's byte of scale (and min top bits), then of min low bits (quant.cl's q4_k_fields) */
    const uchar16 top = __builtin_shufflevector(b0, b1, 4, 5, 20, 21, 6, 7, 22, 23, 8, 9, 24, 25, 10, 11, 26, 27);
    const uchar16 low = __builtin_shufflevector(b0, b1, 12, 13, 28, 29, 14, 15, 30, 31, 12, 13, 28, 29, 14, 15, 30, 31);
    const uint16 scales = convert_uint16(top & (uchar)63);
    const uint16 mins = convert_uint16((uchar16)(low.lo & (uchar)15, low.hi >> (uchar)4) | ((top >> (uchar)6) << (uchar)4));
    rows->scales[0] = as_short32(scales | (scales << 16));
    const float2 dd0 = halves_to_float8(as_ushort8(h0)).s01, dd1 = halves_to_float8(as_ushort8(h1)).s01;
    rows->d = ((float4)(dd0.x, dd0.x, dd1.x, dd1.x)).s0123012301230123;
    rows->mins = convert_float16(mins) * ((float4)(-dd0.y, -dd0.y, -dd1.y, -dd1.y)).s0123012301230123;
}

/* Q6_K's quants in block runs */
__attribute__((always_inline)) inline void read_q6_k_quants(__global const uchar *qs, size_t grp, uint16 *q)
{
    __global const uint4 *p = (__global const uint4 *)(qs + (size_t)Q6_K_GROUP * grp);
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const uint16 n = (uint16)(p[4 * i], p[4 * i + 1], p[4 * i + 2], p[4 * i + 3]);
        const uint8 packed = (uint8)(p[8 + 2 * i], p[9 + 2 * i]);
        /* byte k: nibble byte k's four high bits (quant.cl), 0..1 its low nibble's, 2..3 its high's */
        const uint16 h = (uint16)(packed & 0x0f0f0f0fu, (packed >> 4) & 0x0f0f0f0fu);
        q[2 * i] = (n & 0x0f0f0f0fu) | ((h & 0x03030303u) << 4);
        q[2 * i + 1] = ((n >> 4) & 0x0f0f0f0fu) | ((h & 0x0c0c0c0cu) << 2);
    }
    /* (as decoded: blocks 0..3's first halves, their second, then 4..7's) */
    block_runs(q);
}

/* A Q6_K row pair's sub-block scales, offsets and d from both rows' scale bytes at once,
   straight into pair_lanes' lanes (16-bit lanes 2L, 2L + 1 of lane L = 4m + 2r + p: row r's
   block 2m + p, its first half's scale twice, its second's, or its two halves' offsets) */
__attribute__((always_inline)) inline void read_q6_k_heads(__global const uchar *qs, __global const float *dm,
                                                         size_t grp0, size_t grp1, RowPair *rows)
{
    const char16 s0 = as_char16(((__global const uint4 *)(qs + (size_t)Q6_K_GROUP * grp0))[12]);
    const char16 s1 = as_char16(((__global const uint4 *)(qs + (size_t)Q6_K_GROUP * grp1))[12]);
    rows->scales[0] = __builtin_convertvector(__builtin_shufflevector(s0, s1, 0, 0, 2, 2, 16, 16, 18, 18, 4, 4, 6, 6, 20, 20, 22, 22,
                                                                      8, 8, 10, 10, 24, 24, 26, 26, 12, 12, 14, 14, 28, 28, 30, 30), short32);
    rows->scales[1] = __builtin_convertvector(__builtin_shufflevector(s0, s1, 1, 1, 3, 3, 17, 17, 19, 19, 5, 5, 7, 7, 21, 21, 23, 23,
                                                                      9, 9, 11, 11, 25, 25, 27, 27, 13, 13, 15, 15, 29, 29, 31, 31), short32);
    rows->offsets = __builtin_convertvector(__builtin_shufflevector(s0, s1, 0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23,
                                                                    8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31), short32)
                    * (short)-32;
    const float d0 = halves_to_float8((ushort8)(((__global const ushort *)dm)[grp0])).s0;
    const float d1 = halves_to_float8((ushort8)(((__global const ushort *)dm)[grp1])).s0;
    rows->d = ((float4)(d0, d0, d1, d1)).s0123012301230123;
}

/* pair_lanes of the row pair's products with a column's inputs: every 128 bits blocks
   2m and 2m + 1 of row 0, then of row 1, each scaled by its sub-block scales */
__attribute__((always_inline)) inline int16 pair_lanes(const int wtype, const RowPair *rows, __local const SuperRecord *inputs)
{
    __local const uint16 *x = inputs->quants;
#if SHORT_SUMS
    /* Q4_K's 16 products a row and lane reach 16 * 15 * 127, Q6_K's four 4 * 63 * 127 */
    if (wtype == WT_Q4_K) {
        short32 row0 = 0, row1 = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            row0 += bytes_pairs(rows->q0[i], x[i]);
            row1 += bytes_pairs(rows->q1[i], x[i]);
        }
        return madd(halves_pairs(row0, row1), rows->scales[0]);
    }
    int16 sums = madd(rows->offsets, inputs->sums.halves);
#pragma unroll
    for (int i = 0; i < 4; i++)
        sums += madd(halves_pairs(bytes_pairs(rows->q0[i], x[i]), bytes_pairs(rows->q1[i], x[i])), rows->scales[i / 2]);
    return sums;
#else
    if (wtype == WT_Q4_K) {
        int16 row0 = 0, row1 = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            row0 = dot_bytes_from(row0, rows->q0[i], x + i);
            row1 = dot_bytes_from(row1, rows->q1[i], x + i);
        }
        return madd(pack_halves(row0, row1), rows->scales[0]);
    }
    int16 sums = madd(rows->offsets, inputs->sums.halves);
#pragma unroll
    for (int i = 0; i < 4; i++)
        sums = madd_add(sums, pack_halves(dot_bytes_from((int16)0, rows->q0[i], x + i), dot_bytes_from((int16)0, rows->q1[i], x + i)),
                        rows->scales[i / 2]);
    return sums;
#endif
}

/* pair_lanes of four columns side by side, their records one after another. A column's
   sums are a chain of multiply-adds each waiting on the last, and a core has two
   multipliers that take a new one every cycle but give it back cycles later: four
   columns' chains, interleaved, keep both busy where one column's would leave them
   waiting. The sums are the same bits. (Named, not an array: PoCL keeps a private array
   in memory.) */
__attribute__((always_inline)) inline void pair_lanes4(const int wtype, const RowPair *rows, __local const SuperRecord *x,
                                                       int16 *l0, int16 *l1, int16 *l2, int16 *l3)
{
#if MADD_WIDTH == 512
    if (wtype == WT_Q4_K) {
        int16 a0 = 0, a1 = 0, a2 = 0, a3 = 0, b0 = 0, b1 = 0, b2 = 0, b3 = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            a0 = dot_bytes(a0, rows->q0[i], x[0].quants[i]);
            b0 = dot_bytes(b0, rows->q1[i], x[0].quants[i]);
            a1 = dot_bytes(a1, rows->q0[i], x[1].quants[i]);
            b1 = dot_bytes(b1, rows->q1[i], x[1].quants[i]);
            a2 = dot_bytes(a2, rows->q0[i], x[2].quants[i]);
            b2 = dot_bytes(b2, rows->q1[i], x[2].quants[i]);
            a3 = dot_bytes(a3, rows->q0[i], x[3].quants[i]);
            b3 = dot_bytes(b3, rows->q1[i], x[3].quants[i]);
        }
        *l0 = madd(pack_halves(a0, b0), rows->scales[0]);
        *l1 = madd(pack_halves(a1, b1), rows->scales[0]);
        *l2 = madd(pack_halves(a2, b2), rows->scales[0]);
        *l3 = madd(pack_halves(a3, b3), rows->scales[0]);
        return;
    }
    int16 s0 = madd(rows->offsets, x[0].sums.halves), s1 = madd(rows->offsets, x[1].sums.halves);
    int16 s2 = madd(rows->offsets, x[2].sums.halves), s3 = madd(rows->offsets, x[3].sums.halves);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const short32 scales = rows->scales[i / 2];
        s0 = madd_add(s0, pack_halves(dot_bytes((int16)0, rows->q0[i], x[0].quants[i]), dot_bytes((int16)0, rows->q1[i], x[0].quants[i])), scales);
        s1 = madd_add(s1, pack_halves(dot_bytes((int16)0, rows->q0[i], x[1].quants[i]), dot_bytes((int16)0, rows->q1[i], x[1].quants[i])), scales);
        s2 = madd_add(s2, pack_halves(dot_bytes((int16)0, rows->q0[i], x[2].quants[i]), dot_bytes((int16)0, rows->q1[i], x[2].quants[i])), scales);
        s3 = madd_add(s3, pack_halves(dot_bytes((int16)0, rows->q0[i], x[3].quants[i]), dot_bytes((int16)0, rows->q1[i], x[3].quants[i])), scales);
    }
    *l0 = s0, *l1 = s1, *l2 = s2, *l3 = s3;
#else
    *l0 = pair_lanes(wtype, rows, x), *l1 = pair_lanes(wtype, rows, x + 1);
    *l2 = pair_lanes(wtype, rows, x + 2), *l3 = pair_lanes(wtype, rows, x + 3);
#endif
}

__attribute__((always_inline)) inline void read_row_pair(const int wtype, __global const uchar *qs, __global const float *dm,
                                                       size_t grp0, size_t grp1, RowPair *rows)
{
    if (wtype == WT_Q4_K) {
        read_q4_k_quants(qs, grp0, rows->q0);
        read_q4_k_quants(qs, grp1, rows->q1);
        read_q4_k_heads(qs, grp0, grp1, rows);
        return;
    }
    read_q6_k_quants(qs, grp0, rows->q0);
    read_q6_k_quants(qs, grp1, rows->q1);
    read_q6_k_heads(qs, dm, grp0, grp1, rows);
}

/* The row sums of eight columns' accumulators: column j's row 0 in lane 2j, its row 1 in
 * lane 2j + 1. Each is added in the order hsum8(acc.s08194c5d) and hsum8(acc.s2a3b6e7f) add
 * it, so the bits are the same: row 0 is ((0 + 4) + (1 + 5)) + ((8 + 12) + (9 + 13)) of the
 * lanes, row 1 the same from lane 2. Each step adds two vectors gathered from two partial
 * sums: eight columns take 21 vector operations, not about 10 scalar ones a column. (The
 * loops here and at the call are unrolled: else PoCL's compiler picks lanes through the stack.) */
__attribute__((always_inline)) inline float16 pair_sums8(const float16 *acc)
{
    const uint16 low = (uint16)(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27), high = low + 4;
    const uint16 even = (uint16)(0, 4, 2, 6, 8, 12, 10, 14, 16, 20, 18, 22, 24, 28, 26, 30), odd = even + 1;
    const uint16 evens = (uint16)(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30), odds = evens + 1;
    float16 p[4], q[2];
#pragma unroll
    for (int m = 0; m < 4; m++)  /* lane i + 4 to lane i: (0 + 4, 1 + 5, 2 + 6, 3 + 7, 8 + 12, ...) */
        p[m] = shuffle2(acc[2 * m], acc[2 * m + 1], low) + shuffle2(acc[2 * m], acc[2 * m + 1], high);
#pragma unroll
    for (int m = 0; m < 2; m++)  /* a column's (0 + 1, 8 + 9, 2 + 3, 10 + 11) of those */
        q[m] = shuffle2(p[2 * m], p[2 * m + 1], even) + shuffle2(p[2 * m], p[2 * m + 1], odd);
    return shuffle2(q[0], q[1], evens) + shuffle2(q[0], q[1], odds);
}

/* a column's pair_lanes into its accumulator: times the row's d and the block's input step,
   and for Q4_K the block's min times its float input sum */
__attribute__((always_inline)) inline void scale_lanes(const int wtype, const RowPair *rows, __local const SuperRecord *inputs,
                                                       const int16 lanes, float16 *acc)
{
    const float16 sums = convert_float16(lanes);
    *acc = wtype == WT_Q4_K ? *acc + (sums * (rows->d * inputs->steps) + rows->mins * inputs->sums.floats)
                            : *acc + sums * (rows->d * inputs->steps);
}

/* the row sums of a row pair's accumulators for `tile` columns (a multiple of 8) */
__attribute__((always_inline)) inline void store_pair_sums(const int tile, const float16 *acc, float *out0, float *out1)
{
    for (int c = 0; c < tile; c += 8) {
        const float16 sums = pair_sums8(acc + c);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            out0[c + j] = sums[2 * j];
            out1[c + j] = sums[2 * j + 1];
        }
    }
}

/* pair_dot_super_cols on 8-bit inputs: the quants decoded once a row pair for all the tile's
 * live columns (`tile` of them), each column's sums the same at any width. A lane of the
 * accumulators is a row's block (pair_lanes); each row's result adds its blocks in the order
 * of pair_dot_super_cols' lanes (0, 4, 1, 5, 2, 6, 3, 7). */
__attribute__((always_inline)) inline void pair_dot_super_bytes(const int wtype, const int tile, const int layout,
        __global const uchar *qs, __global const float *dm, int r0, int r1, int k, __local uchar *xl,
        float16 *acc, float *out0, float *out1)
{
    const int nsuper = k / 256;
    __local const SuperRecord *records = (__local const SuperRecord *)xl;
    for (int c = 0; c < tile; c++)
        acc[c] = (float16)0.0f;
    for (int j = 0; j < nsuper; j++) {
        RowPair rows;
        prefetch_run(qs + paired_group(r0, nsuper, j) * SUPER_BYTES(wtype), 2 * SUPER_BYTES(wtype));
        read_row_pair(wtype, qs, dm, paired_group(r0, nsuper, j), paired_group(r1, nsuper, j), &rows);
        for (int c = 0; c < tile; c += tile % 4 ? 1 : 4) {
            __local const SuperRecord *inputs = SUPER_RECORD(records, tile, c, j);
            if (tile % 4) {
                scale_lanes(wtype, &rows, inputs, pair_lanes(wtype, &rows, inputs), acc + c);
                continue;
            }
            int16 l0, l1, l2, l3;
            pair_lanes4(wtype, &rows, inputs, &l0, &l1, &l2, &l3);
            scale_lanes(wtype, &rows, inputs, l0, acc + c);
            scale_lanes(wtype, &rows, inputs + 1, l1, acc + c + 1);
            scale_lanes(wtype, &rows, inputs + 2, l2, acc + c + 2);
            scale_lanes(wtype, &rows, inputs + 3, l3, acc + c + 3);
        }
    }
    if (tile % 8) {
        for (int c = 0; c < tile; c++) {
            out0[c] = hsum8(acc[c].s08194c5d);
            out1[c] = hsum8(acc[c].s2a3b6e7f);
        }
        return;
    }
    store_pair_sums(tile, acc, out0, out1);
}

/* pair_lanes of two row pairs (a: rows r0, r1; b: r2, r3) and two columns: each load of a
   column's inputs serves four rows, where pair_lanes4 has it serve two. A 32-column tile's
   records outgrow L1, and the loop waited on those loads from L2 more than on its
   multiplies. Each lane is pair_lanes' bits. */
__attribute__((always_inline)) inline void quad_lanes2(const int wtype, const RowPair *a, const RowPair *b, __local const SuperRecord *x,
                                                       int16 *a0, int16 *a1, int16 *b0, int16 *b1)
{
#if MADD_WIDTH == 512
    if (wtype == WT_Q4_K) {
        /* row 0 and row 1 of each pair, column 0 and column 1 (named: see pair_lanes4) */
        int16 a00 = 0, a10 = 0, a01 = 0, a11 = 0, b00 = 0, b10 = 0, b01 = 0, b11 = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            a00 = dot_bytes(a00, a->q0[i], x[0].quants[i]);
            a10 = dot_bytes(a10, a->q1[i], x[0].quants[i]);
            b00 = dot_bytes(b00, b->q0[i], x[0].quants[i]);
            b10 = dot_bytes(b10, b->q1[i], x[0].quants[i]);
            a01 = dot_bytes(a01, a->q0[i], x[1].quants[i]);
            a11 = dot_bytes(a11, a->q1[i], x[1].quants[i]);
            b01 = dot_bytes(b01, b->q0[i], x[1].quants[i]);
            b11 = dot_bytes(b11, b->q1[i], x[1].quants[i]);
        }
        *a0 = madd(pack_halves(a00, a10), a->scales[0]);
        *a1 = madd(pack_halves(a01, a11), a->scales[0]);
        *b0 = madd(pack_halves(b00, b10), b->scales[0]);
        *b1 = madd(pack_halves(b01, b11), b->scales[0]);
        return;
    }
    int16 sa0 = madd(a->offsets, x[0].sums.halves), sa1 = madd(a->offsets, x[1].sums.halves);
    int16 sb0 = madd(b->offsets, x[0].sums.halves), sb1 = madd(b->offsets, x[1].sums.halves);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint16 x0 = x[0].quants[i], x1 = x[1].quants[i];
        sa0 = madd_add(sa0, pack_halves(dot_bytes((int16)0, a->q0[i], x0), dot_bytes((int16)0, a->q1[i], x0)), a->scales[i / 2]);
        sb0 = madd_add(sb0, pack_halves(dot_bytes((int16)0, b->q0[i], x0), dot_bytes((int16)0, b->q1[i], x0)), b->scales[i / 2]);
        sa1 = madd_add(sa1, pack_halves(dot_bytes((int16)0, a->q0[i], x1), dot_bytes((int16)0, a->q1[i], x1)), a->scales[i / 2]);
        sb1 = madd_add(sb1, pack_halves(dot_bytes((int16)0, b->q0[i], x1), dot_bytes((int16)0, b->q1[i], x1)), b->scales[i / 2]);
    }
    *a0 = sa0, *a1 = sa1, *b0 = sb0, *b1 = sb1;
#else
    *a0 = pair_lanes(wtype, a, x), *a1 = pair_lanes(wtype, a, x + 1);
    *b0 = pair_lanes(wtype, b, x), *b1 = pair_lanes(wtype, b, x + 1);
#endif
}

/* pair_dot_super_bytes for two row pairs at once (rows r0, r1 into out0, out1; r2, r3 into
 * out2, out3) over the tile's `tile` live columns, a multiple of 8: each pair's results are
 * the bits it has alone. */
__attribute__((always_inline)) inline void quad_dot_super_bytes(const int wtype, const int tile,
        __global const uchar *qs, __global const float *dm, int r0, int r1, int r2, int r3, int k, __local uchar *xl,
        float16 *acc0, float16 *acc1, float *out0, float *out1, float *out2, float *out3)
{
    const int nsuper = k / 256;
    __local const SuperRecord *records = (__local const SuperRecord *)xl;
    for (int c = 0; c < tile; c++)
        acc0[c] = acc1[c] = (float16)0.0f;
    for (int j = 0; j < nsuper; j++) {
        RowPair a, b;
        prefetch_run(qs + paired_group(r0, nsuper, j) * SUPER_BYTES(wtype), 2 * SUPER_BYTES(wtype));
        prefetch_run(qs + paired_group(r2, nsuper, j) * SUPER_BYTES(wtype), 2 * SUPER_BYTES(wtype));
        read_row_pair(wtype, qs, dm, paired_group(r0, nsuper, j), paired_group(r1, nsuper, j), &a);
        read_row_pair(wtype, qs, dm, paired_group(r2, nsuper, j), paired_group(r3, nsuper, j), &b);
        for (int c = 0; c < tile; c += 2) {
            __local const SuperRecord *inputs = SUPER_RECORD(records, tile, c, j);
            int16 la0, la1, lb0, lb1;
            quad_lanes2(wtype, &a, &b, inputs, &la0, &la1, &lb0, &lb1);
            scale_lanes(wtype, &a, inputs, la0, acc0 + c);
            scale_lanes(wtype, &a, inputs + 1, la1, acc0 + c + 1);
            scale_lanes(wtype, &b, inputs, lb0, acc1 + c);
            scale_lanes(wtype, &b, inputs + 1, lb1, acc1 + c + 1);
        }
    }
    store_pair_sums(tile, acc0, out0, out1);
    store_pair_sums(tile, acc1, out2, out3);
}

/* quantize_nibble_columns for Q4_0 and Q4_1 with INT8_NIBBLES (pair_dot_group_bytes): each block
   of 32 inputs to 8-bit integers in steps of its largest |x| / 127 (llama.cpp's Q8_1), column
   c's group s to record c * ng + s. A short last group's inputs past k are zeros, and so are
   their steps. */
__attribute__((always_inline)) inline void quantize_group_columns(__global const float *x, __global const int *xrows, __global const float *g,
                                 int normalize, int k, int c0, int ncols, const int tile, __local uchar *xl)
{
    const int ng = nib_groups(k);
    const int live = tile > MAX_TILE ? min(tile, (ncols - c0 + MAX_TILE - 1) / MAX_TILE * MAX_TILE) : tile;
    for (int u = get_local_id(0); u < live * ng; u += get_local_size(0)) {
        const int c = u / ng, s = u % ng;
        __global const float *xc = x + (size_t)xrows[min(c0 + c, ncols - 1)] * k + NIB_GROUP * s;
        __local GroupRecord *record = (__local GroupRecord *)xl + u;
        __local char16 *first = (__local char16 *)&record->quants[0], *second = (__local char16 *)&record->quants[1];
        float steps[4], sums[4];
#pragma unroll
        for (int b = 0; b < 4; b++) {
            float16 lo = 0.0f, hi = 0.0f;
            if (NIB_GROUP * s + 32 * b < k) {
                lo = normalize ? F16(2 * b, xc) * F16(8 * s + 2 * b, g) : F16(2 * b, xc);
                hi = normalize ? F16(2 * b + 1, xc) * F16(8 * s + 2 * b + 1, g) : F16(2 * b + 1, xc);
            }
            const float amax = as_float(hmax_int16(max(as_int16(lo) & 0x7fffffff, as_int16(hi) & 0x7fffffff)));
            const float to_int = amax > 0.0f ? 127.0f / amax : 0.0f;
            first[b] = convert_char16(ROUND(lo * to_int));
            second[b] = convert_char16(ROUND(hi * to_int));
            steps[b] = amax / 127.0f;
            sums[b] = hsum16(lo + hi) * 0.5f;
        }
        record->steps = ((float4)(steps[0], steps[1], steps[2], steps[3])).s0000111122223333;
        record->sums = ((float4)(sums[0], sums[1], sums[2], sums[3])).s0000111122223333;
    }
}

/* quantize_group_columns between the work-group's barriers */
__attribute__((always_inline)) inline void quantize_group_bytes(__global const float *x, __global const int *xrows, __global const float *g,
                                 int normalize, int k, int c0, int ncols, const int tile, __local uchar *xl)
{
    barrier(CLK_LOCAL_MEM_FENCE);
    quantize_group_columns(x, xrows, g, normalize, k, c0, ncols, tile, xl);
    barrier(CLK_LOCAL_MEM_FENCE);
}

/* A row pair's four blocks of Q4_0 or Q4_1 (read_group_pair): their nibbles as bytes (`lo`:
   weights 0..15 of block b at bytes 16b.., `hi`: 16..31), and d and m in the lanes of
   group_lanes' sums */
typedef struct {
    uint16 lo0, hi0, lo1, hi1;
    float16 d, m;
} GroupPair;

/* the row pair's byte products with a column's inputs `x` (lo against x[0], hi against x[1]):
   every 128 bits one block, two lanes of row 0's sums (its bytes 0..7, 8..15), then two of
   row 1's */
__attribute__((always_inline)) inline int16 group_lanes(const GroupPair *rows, __local const uint16 *x)
{
#if SHORT_SUMS  /* a 16-bit lane adds four products of 15 * 127, then eight */
    return madd(halves_pairs(bytes_pairs(rows->lo0, x[0]) + bytes_pairs(rows->hi0, x[1]),
                             bytes_pairs(rows->lo1, x[0]) + bytes_pairs(rows->hi1, x[1])), (short32)1);
#else
    return madd(pack_halves(dot_bytes_from(dot_bytes_from((int16)0, rows->lo0, x), rows->hi0, x + 1),
                            dot_bytes_from(dot_bytes_from((int16)0, rows->lo1, x), rows->hi1, x + 1)), (short32)1);
#endif
}

/* rows r0's and r1's four blocks from block `blk` of their rows (nb a row) */
__attribute__((always_inline)) inline void read_group_pair(__global const uchar *qs, __global const float *dm, int r0, int r1,
                                                         int nb, int blk, GroupPair *rows)
{
    __global const uint4 *q0 = (__global const uint4 *)qs + (size_t)r0 * nb + blk;
    __global const uint4 *q1 = (__global const uint4 *)qs + (size_t)r1 * nb + blk;
    const uint16 w0 = (uint16)(q0[0], q0[1], q0[2], q0[3]), w1 = (uint16)(q1[0], q1[1], q1[2], q1[3]);
    rows->lo0 = w0 & 0x0f0f0f0fu;
    rows->hi0 = (w0 >> 4) & 0x0f0f0f0fu;
    rows->lo1 = w1 & 0x0f0f0f0fu;
    rows->hi1 = (w1 >> 4) & 0x0f0f0f0fu;
    __global const float2 *s0 = (__global const float2 *)dm + (size_t)r0 * nb + blk;
    __global const float2 *s1 = (__global const float2 *)dm + (size_t)r1 * nb + blk;
    const float8 dm0 = (float8)(s0[0], s0[1], s0[2], s0[3]), dm1 = (float8)(s1[0], s1[1], s1[2], s1[3]);
    rows->d = shuffle2(dm0, dm1, (uint16)(0, 0, 8, 8, 2, 2, 10, 10, 4, 4, 12, 12, 6, 6, 14, 14));
    rows->m = shuffle2(dm0, dm1, (uint16)(1, 1, 9, 9, 3, 3, 11, 11, 5, 5, 13, 13, 7, 7, 15, 15));
}

/* pair_dot_nibble_cols for Q4_0 and Q4_1 on 8-bit inputs (quantize_group_bytes): a row pair's
 * integer sums a block at a time (group_lanes), times d and the block's input step, and m
 * against the block's float input sum (half in each of a row's two lanes). Each column's sums
 * are the same at any width, and its records are where they are at any tile's width. */
__attribute__((always_inline)) inline void pair_dot_group_bytes(const int tile,
        __global const uchar *qs, __global const float *dm, int r0, int r1, int k, __local uchar *xl,
        float16 *acc, float *out0, float *out1)
{
    const int nb = k / 32, ng = nib_groups(k);
    __local const GroupRecord *records = (__local const GroupRecord *)xl;
    for (int c = 0; c < tile; c++)
        acc[c] = (float16)0.0f;
    for (int s = 0; s < ng; s++) {
        GroupPair rows;
        prefetch_pair(qs, dm, r0, r1, nb, 4 * s, 4, QS_BYTES(WT_Q4_1), DM_BYTES(WT_Q4_1));
        read_group_pair(qs, dm, r0, r1, nb, 4 * s, &rows);
        for (int c = 0; c < tile; c++) {
            __local const GroupRecord *inputs = records + (size_t)c * ng + s;
            acc[c] += convert_float16(group_lanes(&rows, inputs->quants)) * (rows.d * inputs->steps) + rows.m * inputs->sums;
        }
    }
    for (int c = 0; c < tile; c++) {
        out0[c] = hsum8(acc[c].s014589cd);
        out1[c] = hsum8(acc[c].s2367abef);
    }
}

#define PAIR_DOT_SUPER pair_dot_super_bytes
#else
#define PAIR_DOT_SUPER pair_dot_super_cols
#endif

/* A prompt's many columns as a GEMM: a 32-column tile is quantized at once, and each row
 * pair decodes a group of blocks once for all of its (live) columns, not once per 8, and
 * streams its weights once per 32 columns. Each column is added exactly as in an 8-column
 * tile, so its bits do not depend on the width either. The host takes it for Q4_K and Q6_K
 * on 8-bit inputs, whose SuperRecords take 320 bytes a super-block and column, and for the
 * other kinds only when asked (SLOTSWARM_GEMM=1): their 16-bit inputs take 648, a row pair
 * reads far more input bytes than weight bytes, and an 8-column tile's inputs stay in L1
 * for the whole work-group where 32 columns' do not. */
__attribute__((always_inline)) inline void pair_dot_nibbles(const int wtype, const int tile,
        __global const uchar *qs, __global const float *dm, int r0, int r1, int k, int c0, int ncols,
        __local uchar *xl, float *out0, float *out1)
{
    if (tile <= MAX_TILE) {
        float16 a0[MAX_TILE], a1[MAX_TILE];
        if (SUPER_KIND(wtype))
            PAIR_DOT_SUPER(wtype, tile, tile, qs, dm, r0, r1, k, xl, a0, out0, out1);
#if INT8_INPUTS && INT8_NIBBLES
        else if (wtype == WT_Q4_1)
            pair_dot_group_bytes(tile, qs, dm, r0, r1, k, xl, a0, out0, out1);
#endif
        else
            pair_dot_nibble_cols(wtype, tile, tile, qs, dm, r0, r1, k, xl, a0, a1, out0, out1);
        return;
    }
    float16 a0[GEMM_TILE], a1[GEMM_TILE];
    const int live = min(tile, (ncols - c0 + MAX_TILE - 1) / MAX_TILE * MAX_TILE);
    if (SUPER_KIND(wtype))
        PAIR_DOT_SUPER(wtype, live, tile, qs, dm, r0, r1, k, xl, a0, out0, out1);
#if INT8_INPUTS && INT8_NIBBLES
    else if (wtype == WT_Q4_1)
        pair_dot_group_bytes(live, qs, dm, r0, r1, k, xl, a0, out0, out1);
#endif
    else
        pair_dot_nibble_cols(wtype, live, tile, qs, dm, r0, r1, k, xl, a0, a1, out0, out1);
}

/* pair_dot_nibbles on the 32-column tile for the two row pairs a work-item owns there (r0,
   r1 and r2, r3): on 8-bit inputs Q4_K's and Q6_K's share each load of the inputs
   (quad_dot_super_bytes), the other kinds take one pair after the other */
__attribute__((always_inline)) inline void quad_dot_nibbles(const int wtype, __global const uchar *qs, __global const float *dm,
        int r0, int r1, int r2, int r3, int k, int c0, int ncols, __local uchar *xl,
        float *out0, float *out1, float *out2, float *out3)
{
#if INT8_INPUTS
    if (SUPER_KIND(wtype)) {
        float16 a0[GEMM_TILE], a1[GEMM_TILE];
        const int live = min(GEMM_TILE, (ncols - c0 + MAX_TILE - 1) / MAX_TILE * MAX_TILE);
        quad_dot_super_bytes(wtype, live, qs, dm, r0, r1, r2, r3, k, xl, a0, a1, out0, out1, out2, out3);
        return;
    }
#endif
    pair_dot_nibbles(wtype, GEMM_TILE, qs, dm, r0, r1, k, c0, ncols, xl, out0, out1);
    pair_dot_nibbles(wtype, GEMM_TILE, qs, dm, r2, r3, k, c0, ncols, xl, out2, out3);
}

/* A tile's inputs quantized into the local buffer, as each kind takes them: a scale a group
   of 128 (nibble kinds), or for Q4_K and Q6_K a super-block of 256, in 16 bits; with
   INT8_INPUTS, Q4_K's and Q6_K's a block in 8 in SuperRecords, and with INT8_NIBBLES Q4_0's
   and Q4_1's in GroupRecords (their RECORDS) */
#define QUANTIZE_NIBBLES(TILE, normalize)                                       \
    quantize_nibble_tile(x, xrows, g, normalize, k, c0, ncols, TILE, 1, (__local uchar *)xl)
#if INT8_INPUTS
#define QUANTIZE_Q4_K(TILE, normalize)                                          \
    quantize_super_bytes(x, xrows, g, normalize, k, c0, ncols, TILE, WT_Q4_K, (__local uchar *)xl)
#define QUANTIZE_Q6_K(TILE, normalize)                                          \
    quantize_super_bytes(x, xrows, g, normalize, k, c0, ncols, TILE, WT_Q6_K, (__local uchar *)xl)
#define K_RECORDS SUPER_RECORDS
#else
#define QUANTIZE_Q4_K(TILE, normalize)                                          \
    quantize_nibble_tile(x, xrows, g, normalize, k, c0, ncols, TILE, 2, (__local uchar *)xl)
#define QUANTIZE_Q6_K QUANTIZE_Q4_K
#define K_RECORDS NO_RECORDS
#endif
#if INT8_INPUTS && INT8_NIBBLES
#define QUANTIZE_Q4_1(TILE, normalize)                                          \
    quantize_group_bytes(x, xrows, g, normalize, k, c0, ncols, TILE, (__local uchar *)xl)
#define Q4_RECORDS GROUP_RECORDS
#else
#define QUANTIZE_Q4_1 QUANTIZE_NIBBLES
#define Q4_RECORDS NO_RECORDS
#endif

/* Staging. Every work-group of a matmul quantizes the same columns (its rows differ, its
 * inputs do not), so a matrix of 8960 rows quantized each column 70 times, and took each
 * column's RMS 70 times. For a wide batch the host stages them instead (gpu/launches.py's
 * CPUStage): a stage_* kernel quantizes each tile of MAX_TILE columns once, into a global
 * buffer that holds the columns' RMS scales (column_scales'), then their inputs laid out
 * as the local buffer lays them out at a width of `cols` columns, and each work-group of
 * the matmul copies its tiles' columns from there. The bytes are the ones it would have
 * made, so a column's results are the same bits staged or not. `records`: how the inputs
 * are laid out (NO_RECORDS, SUPER_RECORDS or GROUP_RECORDS). */
#define STAGED_RMS(p) ((__global float *)(p))
#define STAGED_AFTER_RMS(p, cols) ((__global uchar *)(p) + (((cols) * 4 + 63) & ~63))
#define STAGED_SUMS(p, cols, ng) ((__global float16 *)STAGED_AFTER_RMS(p, cols))
#define STAGED_INPUTS(p, cols, ng) ((__global short32 *)(STAGED_SUMS(p, cols, ng) + (cols) * (ng)))
#define STAGED_SCALES(p, cols, ng) ((__global float *)(STAGED_INPUTS(p, cols, ng) + 4 * (cols) * (ng)))
#define STAGED_RECORDS(p, cols) ((__global uint16 *)STAGED_AFTER_RMS(p, cols))
/* a column's records, in 64-byte vectors */
#define RECORD_VECTORS(records, k) ((records) == SUPER_RECORDS ? (k) / 256 * (int)(sizeof(SuperRecord) / sizeof(uint16)) \
                                    : nib_groups(k) * (int)(sizeof(GroupRecord) / sizeof(uint16)))

/* the local vector of n columns' records that is vector u of them staged (a column's after
   another): SuperRecords lie super-block by super-block locally (SUPER_RECORD), GroupRecords
   as staged */
inline int local_record_vector(const int records, int n, int per_column, int u)
{
    if (records != SUPER_RECORDS)
        return u;
    const int per_record = (int)(sizeof(SuperRecord) / sizeof(uint16)), c = u / per_column, v = u % per_column;
    return ((v / per_record) * n + c) * per_record + v % per_record;  /* (SUPER_RECORD's order) */
}

/* columns 0.. n - 1 of a `tile`-column local buffer to columns c0.. of the staged one */
inline void store_staged(__local const uchar *xl, const int tile, __global uchar *staged, int cols, int k, int c0, int n,
                         const int records)
{
    if (records) {
        const int per_column = RECORD_VECTORS(records, k);
        for (int u = get_local_id(0); u < n * per_column; u += get_local_size(0))
            STAGED_RECORDS(staged, cols)[c0 * per_column + u] = ((__local const uint16 *)xl)[local_record_vector(records, n, per_column, u)];
        return;
    }
    const int ng = nib_groups(k);
    for (int u = get_local_id(0); u < n * ng; u += get_local_size(0)) {
        const int at = u, to = c0 * ng + u;  /* (a column's groups follow each other in both) */
        STAGED_SUMS(staged, cols, ng)[to] = NIB_SUMS(xl, tile, ng)[at];
        for (int i = 0; i < 4; i++)
            STAGED_INPUTS(staged, cols, ng)[4 * to + i] = NIB_INPUTS(xl, tile, ng)[4 * at + i];
        STAGED_SCALES(staged, cols, ng)[to] = NIB_SCALES(xl, tile, ng)[at];
    }
}

/* A work-item's share of n units of a copy, [first, last): one run each. A core streams a
   run; items taking every get_local_size(0)-th unit each read one line of a page and
   leave the prefetchers nothing to follow. */
inline int2 item_run(int n)
{
    const int per = (n + (int)get_local_size(0) - 1) / (int)get_local_size(0);
    const int first = min(n, (int)get_local_id(0) * per);
    return (int2)(first, min(n, first + per));
}

/* columns c0.. c0 + n - 1 of the staged buffer to columns 0.. of a `tile`-column local one */
inline void load_staged(__global const uchar *staged, int cols, int k, int c0, int n, const int tile, __local uchar *xl,
                        const int records)
{
    const int ng = nib_groups(k);
    barrier(CLK_LOCAL_MEM_FENCE);
    if (records == SUPER_RECORDS) {
        /* record by record in the staged order (a column's after another), each to its
           place super-block by super-block (SUPER_RECORD) */
        const int nsuper = k / 256;
        const int2 run = item_run(n * nsuper);
        __global const SuperRecord *from = (__global const SuperRecord *)STAGED_RECORDS(staged, cols) + (size_t)c0 * nsuper;
        int c = run.x / nsuper, j = run.x % nsuper;
        for (int u = run.x; u < run.y; u++) {
            *SUPER_RECORD((__local SuperRecord *)xl, n, c, j) = from[u];
            if (++j == nsuper)
                j = 0, c++;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        return;
    }
    if (records) {
        const int per_column = RECORD_VECTORS(records, k);
        const int2 run = item_run(n * per_column);
        for (int u = run.x; u < run.y; u++)
            ((__local uint16 *)xl)[u] = STAGED_RECORDS(staged, cols)[c0 * per_column + u];
        barrier(CLK_LOCAL_MEM_FENCE);
        return;
    }
    const int2 run = item_run(n * ng);
    for (int u = run.x; u < run.y; u++) {
        const int at = u, from = c0 * ng + u;
        NIB_SUMS(xl, tile, ng)[at] = STAGED_SUMS(staged, cols, ng)[from];
        for (int i = 0; i < 4; i++)
            NIB_INPUTS(xl, tile, ng)[4 * at + i] = STAGED_INPUTS(staged, cols, ng)[4 * from + i];
        NIB_SCALES(xl, tile, ng)[at] = STAGED_SCALES(staged, cols, ng)[from];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}

/* the batch's column scales (column_scales) from the staged buffer */
inline void load_staged_scales(__global const uchar *staged, int ncols, __local float *inv)
{
    for (int c = get_local_id(0); c < ncols; c += get_local_size(0))
        inv[c] = STAGED_RMS(staged)[c];
    barrier(CLK_LOCAL_MEM_FENCE);
}

/* the columns of a tile from c0 that hold inputs: a wide tile's past the batch, rounded up
   to MAX_TILE, are skipped (pair_dot_nibbles) */
#define LIVE_COLUMNS(TILE) ((TILE) > MAX_TILE ? min(TILE, (ncols - c0 + MAX_TILE - 1) / MAX_TILE * MAX_TILE) : (TILE))

/* stage_NAME: columns MAX_TILE * group.. of g * x (x when `normalize` is 0), quantized as
   NAME's matmuls take them (as RECORDS says), into `staged` (`cols` columns wide), and their
   column scales */
#define DEFINE_STAGE(NAME, QUANTIZE, RECORDS)                                   \
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))                        \
void stage_##NAME(__global const float *g, __global const float *x, __global const int *xrows, float eps, \
                  int k, int ncols, int normalize, __global uchar *staged, int cols, __local short *xl) \
{                                                                               \
    const int c0 = MAX_TILE * get_group_id(0), n = min(MAX_TILE, ncols - c0);  \
    __local float inv[MAX_TILE];                                                \
    column_scales_from(x, xrows, c0, n, k, eps, normalize, inv);                \
    QUANTIZE(MAX_TILE, normalize); /* (its barriers order inv's stores too) */  \
    store_staged((__local uchar *)xl, MAX_TILE, staged, cols, k, c0, MAX_TILE, RECORDS); \
    for (int c = get_local_id(0); c < n; c += get_local_size(0))                \
        STAGED_RMS(staged)[c0 + c] = inv[c];                                    \
}

/* cpu/matmul.cl's fused kernels with these hooks, as cpu/lowbit.cl's (kinds q4_1, q5,
   q6 and q8_0 as "nib", "nib5", "nib6" and "nib8"), and `staged_cols` 0 where each
   work-group quantizes its own tiles, else the width of the staged inputs it copies */
#define NIBBLE_ARGS , __global const uchar *staged, int staged_cols, __local short *xl
#define NIBBLE_BEGIN(normalize)                                                 \
    __local float inv[MAX_COLS];                                                \
    if (staged_cols)                                                            \
        load_staged_scales(staged, ncols, inv);                                 \
    else                                                                        \
        column_scales(x, xrows, ncols, k, eps, normalize, inv);                 \
    const int r = 2 * get_global_id(0);                                         \
    const int active = r < rows;
#define NIBBLE_TILE_BEGIN(QUANTIZE, RECORDS, TILE, normalize)                   \
    if (staged_cols)                                                            \
        load_staged(staged, staged_cols, k, c0, LIVE_COLUMNS(TILE), TILE, (__local uchar *)xl, RECORDS); \
    else                                                                        \
        QUANTIZE(TILE, normalize);                                              \
    if (!active)                                                                \
        continue;
#define NIBBLES_BEGIN(TILE, normalize) NIBBLE_TILE_BEGIN(QUANTIZE_NIBBLES, NO_RECORDS, TILE, normalize)
#define Q4_1_BEGIN(TILE, normalize) NIBBLE_TILE_BEGIN(QUANTIZE_Q4_1, Q4_RECORDS, TILE, normalize)
#define Q4_K_BEGIN(TILE, normalize) NIBBLE_TILE_BEGIN(QUANTIZE_Q4_K, K_RECORDS, TILE, normalize)
#define Q6_K_BEGIN(TILE, normalize) NIBBLE_TILE_BEGIN(QUANTIZE_Q6_K, K_RECORDS, TILE, normalize)
#define NIBBLE_DOT(WTYPE, TILE, normalize, r0, r1, out0, out1)                  \
    pair_dot_nibbles(WTYPE, TILE, qs, dm, r0, r1, k, c0, ncols, (__local uchar *)xl, out0, out1)

/* The 32-column tile's three kernels, as cpu/matmul.cl's DEFINE_FUSED makes the others, but
 * a work-item owns two row pairs, r and r2 = r + 2 (rows 4 * its id on; the host gives these
 * kernels half the work-items), whose dots share the tile's inputs (quad_dot_nibbles). A
 * second pair past the rows runs the first's dots again and stores nothing. */
#define WIDE_BEGIN                                                              \
    __local float inv[MAX_COLS];                                                \
    if (staged_cols)                                                            \
        load_staged_scales(staged, ncols, inv);                                 \
    else                                                                        \
        column_scales(x, xrows, ncols, k, eps, normalize, inv);                 \
    const int r = 4 * get_global_id(0);                                         \
    const int active = r < rows, second = r + 2 < rows, r2 = second ? r + 2 : r;
#define WIDE_DOT(WTYPE, r0, r1, r2, r3, out0, out1, out2, out3)                 \
    quad_dot_nibbles(WTYPE, qs, dm, r0, r1, r2, r3, k, c0, ncols, (__local uchar *)xl, out0, out1, out2, out3)

/* a work-group's first column of the batch, and the columns to its next tile: where the
   groups of rows do not share evenly among the cores, the host gives each group of rows
   get_num_groups(1) work-groups, which take every get_num_groups(1)-th tile */
#define FIRST_TILE (GEMM_TILE * (int)get_group_id(1))
#define TILE_STRIDE (GEMM_TILE * (int)get_num_groups(1))

#define DEFINE_WIDE(NAME, WTYPE, TILE_BEGIN)                                    \
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))                        \
void matmul_##NAME##_t32(MATMUL_ARGS, int normalize, int accumulate NIBBLE_ARGS) \
{                                                                               \
    WIDE_BEGIN                                                                  \
    const int r1 = min(r + 1, rows - 1), r3 = min(r2 + 1, rows - 1);            \
    for (int c0 = FIRST_TILE; c0 < ncols; c0 += TILE_STRIDE) {                 \
        TILE_BEGIN(GEMM_TILE, normalize)                                        \
        float o0[GEMM_TILE], o1[GEMM_TILE], o2[GEMM_TILE], o3[GEMM_TILE];       \
        WIDE_DOT(WTYPE, r, r1, r2, r3, o0, o1, o2, o3);                         \
        const int n = min(GEMM_TILE, ncols - c0);                               \
        store_rows(o0, o1, n, r, r1, accumulate, inv + c0, y + (size_t)c0 * rows, rows); \
        if (second)                                                             \
            store_rows(o2, o3, n, r2, r3, accumulate, inv + c0, y + (size_t)c0 * rows, rows); \
    }                                                                           \
}                                                                               \
                                                                                \
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))                        \
void swiglu_##NAME##_t32(MATMUL_ARGS NIBBLE_ARGS)                               \
{                                                                               \
    const int normalize = 1;                                                    \
    WIDE_BEGIN                                                                  \
    for (int c0 = FIRST_TILE; c0 < ncols; c0 += TILE_STRIDE) {                 \
        TILE_BEGIN(GEMM_TILE, 1)                                                \
        float g0[GEMM_TILE], g1[GEMM_TILE], g2[GEMM_TILE], g3[GEMM_TILE];       \
        float u0[GEMM_TILE], u1[GEMM_TILE], u2[GEMM_TILE], u3[GEMM_TILE];       \
        float16 act0[GEMM_TILE / 8], act1[GEMM_TILE / 8];                       \
        const int n = min(GEMM_TILE, ncols - c0);                               \
        WIDE_DOT(WTYPE, r, r + 1, r2, r2 + 1, g0, g1, g2, g3);                  \
        activate_gates(g0, g1, n, inv + c0, act0);                              \
        activate_gates(g2, g3, n, inv + c0, act1);                              \
        WIDE_DOT(WTYPE, rows + r, rows + r + 1, rows + r2, rows + r2 + 1, u0, u1, u2, u3); \
        store_swiglus(act0, u0, u1, n, inv + c0, y + (size_t)c0 * rows, r, rows); \
        if (second)                                                             \
            store_swiglus(act1, u2, u3, n, inv + c0, y + (size_t)c0 * rows, r2, rows); \
    }                                                                           \
}                                                                               \
                                                                                \
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))                        \
void qkv_##NAME##_t32(MATMUL_ARGS, __global const int *pos,                    \
                      __global const int *seq, __global const int *tables,      \
                      int max_blocks, __global const float *rope,               \
                      __global half *kcache, __global half *vcache,             \
                      int layer NIBBLE_ARGS)                                    \
{                                                                               \
    const int normalize = 1;                                                    \
    WIDE_BEGIN                                                                  \
    /* (DEFINE_FUSED's qkv: a part's work-items start at its first row, over 4) */ \
    const int w0 = r - 4 * (int)get_global_offset(0), w2 = w0 + (r2 - r);     \
    for (int c0 = FIRST_TILE; c0 < ncols; c0 += TILE_STRIDE) {                 \
        TILE_BEGIN(GEMM_TILE, 1)                                                \
        float o0[GEMM_TILE], o1[GEMM_TILE], o2[GEMM_TILE], o3[GEMM_TILE];       \
        WIDE_DOT(WTYPE, w0, w0 + 1, w2, w2 + 1, o0, o1, o2, o3);                \
        const int n = min(GEMM_TILE, ncols - c0);                               \
        store_qkv(o0, o1, n, r, c0, inv + c0, pos, seq, tables, max_blocks, rope, y, kcache, vcache, layer); \
        if (second)                                                             \
            store_qkv(o2, o3, n, r2, c0, inv + c0, pos, seq, tables, max_blocks, rope, y, kcache, vcache, layer); \
    }                                                                           \
}

/* each kind's stage kernel and fused kernels at every tile width; BEGIN quantizes or
   copies the tile's inputs, QUANTIZE (its QUANTIZE_*) says how, RECORDS in what layout */
#define DEFINE_NIBBLE_MATMULS(NAME, WTYPE, BEGIN, QUANTIZE, RECORDS)            \
    DEFINE_STAGE(NAME, QUANTIZE, RECORDS)                                       \
    DEFINE_FUSED(NAME, WTYPE, 1, WG, NIBBLE_ARGS, NIBBLE_BEGIN, BEGIN, NIBBLE_DOT) \
    DEFINE_FUSED(NAME, WTYPE, 2, WG, NIBBLE_ARGS, NIBBLE_BEGIN, BEGIN, NIBBLE_DOT) \
    DEFINE_FUSED(NAME, WTYPE, 4, WG, NIBBLE_ARGS, NIBBLE_BEGIN, BEGIN, NIBBLE_DOT) \
    DEFINE_FUSED(NAME, WTYPE, 8, WG, NIBBLE_ARGS, NIBBLE_BEGIN, BEGIN, NIBBLE_DOT) \
    DEFINE_WIDE(NAME, WTYPE, BEGIN)

#ifdef MATMUL_nib
DEFINE_NIBBLE_MATMULS(nib, WT_Q4_1, Q4_1_BEGIN, QUANTIZE_Q4_1, Q4_RECORDS)
#endif
#ifdef MATMUL_nib5
DEFINE_NIBBLE_MATMULS(nib5, WT_Q5, NIBBLES_BEGIN, QUANTIZE_NIBBLES, NO_RECORDS)
#endif
#ifdef MATMUL_nib6
DEFINE_NIBBLE_MATMULS(nib6, WT_Q6, NIBBLES_BEGIN, QUANTIZE_NIBBLES, NO_RECORDS)
#endif
#ifdef MATMUL_nib8
DEFINE_NIBBLE_MATMULS(nib8, WT_Q8_0, NIBBLES_BEGIN, QUANTIZE_NIBBLES, NO_RECORDS)
#endif
#ifdef MATMUL_nibq4k
DEFINE_NIBBLE_MATMULS(nibq4k, WT_Q4_K, Q4_K_BEGIN, QUANTIZE_Q4_K, K_RECORDS)
#endif
#ifdef MATMUL_nibq6k
DEFINE_NIBBLE_MATMULS(nibq6k, WT_Q6_K, Q6_K_BEGIN, QUANTIZE_Q6_K, K_RECORDS)
#endif
#ifdef MATMUL_nibq50
DEFINE_NIBBLE_MATMULS(nibq50, WT_Q5_0, NIBBLES_BEGIN, QUANTIZE_NIBBLES, NO_RECORDS)
#endif

/* lane sums, as a uint (modulo 2^32) */
inline uint lanes_total(int16 v)
{
    const uint16 s = as_uint16(v);
    const uint8 a = s.lo + s.hi;
    const uint4 b = a.lo + a.hi;
    const uint2 c = b.lo + b.hi;
    return c.x + c.y;
}

/* The multiplies the integer matmuls are built on, alone: their rate is the most a prompt's
 * matmuls could reach if nothing else took the core's time (swarm bench engine's multiply
 * ceiling). A work-item runs `rounds` rounds of CEILING_SUMS independent multiply-adds of a
 * register each: for `bits` 8, unsigned bytes times signed ones as the 8-bit matmuls take
 * them (64 products: dot_bytes, or on AVX2 bytes_pairs into 16-bit sums, as pair_lanes adds
 * them); for 16, pairs of 16-bit lanes (32: madd_add). Each round adds one to every input
 * byte, so no product is the same from round to round; out[i] is work-item i's sum of them
 * all, exact (modulo 2^32) while no lane wraps, as in the tests' few rounds. On AVX-512,
 * CEILING_CHAINS rounds run at once into their own sums: a core starts two 512-bit
 * multiply-adds a cycle and has each one's sum back cycles later, so four chains would time
 * their wait, not the multipliers. */
#define CEILING_SUMS 4  /* a round's multiply-adds: registers of weights */
#define CEILING_CHAINS (MADD_WIDTH == 512 ? 3 : 1)

/* a multiply_ceiling multiply-add: dot_bytes for `bits` 8, madd_add for 16 */
inline int16 ceiling_step(const int bits, int16 sum, uint16 weights, uint16 x)
{
#if INT8_INPUTS && !SHORT_SUMS
    if (bits == 8)
        return dot_bytes(sum, weights, x);
#endif
    return madd_add(sum, as_short32(weights), as_short32(x));
}

/* multiply_ceiling's rounds of ceiling_step, CEILING_CHAINS at once, and the sum of their
   products (inlined for each `bits`, so the loop holds no branch) */
__attribute__((always_inline)) inline uint ceiling_rounds(const int bits, int rounds, const uint16 *weights, uint16 x)
{
    int16 sums[CEILING_CHAINS][CEILING_SUMS] = {{0}};
    int r = 0;
    for (; r + CEILING_CHAINS <= rounds; r += CEILING_CHAINS, x += CEILING_CHAINS * 0x01010101u)
#pragma unroll
        for (int c = 0; c < CEILING_CHAINS; c++)
#pragma unroll
            for (int i = 0; i < CEILING_SUMS; i++)
                sums[c][i] = ceiling_step(bits, sums[c][i], weights[i], x + (uint)c * 0x01010101u);
    for (; r < rounds; r++, x += 0x01010101u)
#pragma unroll
        for (int i = 0; i < CEILING_SUMS; i++)
            sums[0][i] = ceiling_step(bits, sums[0][i], weights[i], x);
    uint total = 0;
    for (int c = 0; c < CEILING_CHAINS; c++)
        for (int i = 0; i < CEILING_SUMS; i++)
            total += lanes_total(sums[c][i]);
    return total;
}

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void multiply_ceiling(int rounds, int bits, __global uint *out)
{
    const uint16 bytes = (uint16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15) * 0x04040404u + 0x03020100u;
    uint16 weights[CEILING_SUMS];
    for (int i = 0; i < CEILING_SUMS; i++)
        weights[i] = (bytes + (uint)i * 0x01010101u) & 0x0f0f0f0fu;  /* 0..15, as nibbles */
    uint16 x = bytes & 0x1f1f1f1fu;
    uint total = 0;
#if INT8_INPUTS && SHORT_SUMS
    if (bits == 8) {
        short32 sums[CEILING_SUMS] = {0};
        for (int r = 0; r < rounds; r++, x += 0x01010101u)
#pragma unroll
            for (int i = 0; i < CEILING_SUMS; i++)
                sums[i] += bytes_pairs(weights[i], x);
        for (int i = 0; i < CEILING_SUMS; i++)
            total += lanes_total(madd(sums[i], (short32)1));
    }
#else
    if (INT8_INPUTS && bits == 8)
        total = ceiling_rounds(8, rounds, weights, x);
#endif
    if (bits == 16)
        total = ceiling_rounds(16, rounds, weights, x);
    out[get_global_id(0)] = total;
}
