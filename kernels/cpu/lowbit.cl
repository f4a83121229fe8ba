/* CPU family: Q2_K and Q3_K (kinds q2, q3) times a batch of vectors, in integer
 * arithmetic. Built after cpu/matmul.cl, whose kernels these mirror (same names,
 * arguments and fused glue), plus a local buffer the host sizes (gpu/launches.py).
 *
 * Decoding 2- and 3-bit weights to floats took three times the instructions of
 * Q4_1's nibbles per weight, and each weight is used once per decode step. So, as
 * llama.cpp's CPU back end does, the work-group first quantizes the tile's input
 * columns, per super-block of 256, to 16-bit integers (rounding error at most
 * 1/65534 of the block's largest |x|; 8 bits would move logits past the tests'
 * tolerance), and every row then takes integer dot products with its quants as
 * they are: pairwise multiply-adds of 16-bit lanes (pmaddwd), 32 weights an
 * instruction, with each sub-block's scale applied once to its integer sum and the
 * offsets (Q2_K's mins, Q3_K's -4) taken from the inputs' per-16 sums.
 *
 * The quants' layout (gpu/weights.py) puts sub-block u's even and odd weights in
 * 16-bit lanes 2u and 2u + 1, eight 2-bit fields a lane, so step f's field of every
 * lane meets its input in the same lane, the pairwise add keeps sub-blocks apart,
 * and a 32-bit lane of the sums is one sub-block. The inputs are stored to match:
 * step f's 32 inputs are pairs 8u + f of the super-block, a transpose of its 128
 * pairs, done once per work-group (LOWBIT_WG work-items, two rows each).
 */

typedef short short32 __attribute__((ext_vector_type(32)));
typedef uchar uchar32 __attribute__((ext_vector_type(32)));
#define as_short32(v) __builtin_astype((v), short32)

/* The widest pmaddwd the target has (tests build each width) */
#ifndef MADD_WIDTH
#if defined(__AVX512BW__)
#define MADD_WIDTH 512
#elif defined(__AVX2__)
#define MADD_WIDTH 256
#else
#define MADD_WIDTH 0
#endif
#endif

/* lane u: a[2u] b[2u] + a[2u+1] b[2u+1], exact in 32 bits. LLVM does not find
   pmaddwd in the plain expression, so x86 builds name it. */
inline int16 madd(short32 a, short32 b)
{
#if MADD_WIDTH == 512
    typedef short s32 __attribute__((__vector_size__(64)));
    return __builtin_convertvector(__builtin_ia32_pmaddwd512((s32)a, (s32)b), int16);
#elif MADD_WIDTH == 256
    typedef short s16 __attribute__((__vector_size__(32)));
    typedef int i8 __attribute__((__vector_size__(32)));
    const i8 lo = __builtin_ia32_pmaddwd256((s16)a.lo, (s16)b.lo), hi = __builtin_ia32_pmaddwd256((s16)a.hi, (s16)b.hi);
    return (int16)(__builtin_convertvector(lo, int8), __builtin_convertvector(hi, int8));
#else
    return convert_int16(a.even) * convert_int16(b.even) + convert_int16(a.odd) * convert_int16(b.odd);
#endif
}

/* VNNI where the host says the CPU has it at the kernels' width: AVX-512 VNNI for 512 bits
   (DOT_VNNI=1, gpu/families.py), AVX-VNNI for 256 (AVX_VNNI=1: Intel's client cores since
   Alder Lake, which have no AVX-512). The distribution's PoCL compiles for its kernel
   library's CPU (skylake-avx512 or haswell, neither with VNNI, whatever
   POCL_LLVM_CPU_NAME says), so the compiler never emits its instructions, but its assembler
   takes them inline; AVX-VNNI's as {vex} forms on registers 0-15 (constraint "x"), the only
   ones a VEX prefix names. (The compiler's builtins for them need functions built for the
   feature, and PoCL's work-group functions, which inline the kernels, are not.) */
#ifndef DOT_VNNI
#define DOT_VNNI 0
#endif
#ifndef AVX_VNNI
#define AVX_VNNI 0
#endif
#if DOT_VNNI && MADD_WIDTH == 512
#define VNNI_WIDTH 512
#elif AVX_VNNI && MADD_WIDTH == 256
#define VNNI_WIDTH 256
#else
#define VNNI_WIDTH 0
#endif

/* acc + madd(a, b): one vpdpwssd with AVX-512 VNNI. Integer adds wrap alike in any order,
   so both forms give the same bits. AVX-VNNI's is not taken: with AVX2's 16 registers the
   compiler stores and reloads the 16-bit kernels' operands around its inline assembly,
   which costs more than the add it saves (cpu/nibbles.cl's dot_bytes_from takes its
   vpdpbusd, whose inputs it reads from memory). */
inline int16 madd_add(int16 acc, short32 a, short32 b)
{
#if VNNI_WIDTH == 512
    typedef int v16i __attribute__((__vector_size__(64)));
    v16i s = __builtin_astype(acc, v16i);
    __asm__("vpdpwssd %2, %1, %0" : "+v"(s) : "v"(__builtin_astype(a, v16i)), "v"(__builtin_astype(b, v16i)));
    return __builtin_astype(s, int16);
#else
    return acc + madd(a, b);
#endif
}

/* The local buffer: [tile][k] inputs as shorts in the quants' order, [tile][k/256]
   int16 per-16 sums, [tile][k/256] float scales. */
#define LOWBIT_INPUTS(xl, tile, k) ((__local short *)(xl))
#define LOWBIT_SUMS(xl, tile, k) ((__local int16 *)((__local short *)(xl) + (tile) * (k)))
#define LOWBIT_SCALES(xl, tile, k) ((__local float *)(LOWBIT_SUMS(xl, tile, k) + (tile) * ((k) / 256)))

inline int hmax_int16(int16 v)
{
    int8 a = max(v.lo, v.hi);
    int4 b = max(a.lo, a.hi);
    int2 c = max(b.lo, b.hi);
    return max(c.x, c.y);
}

/* v rounded to the nearest integer, ties to even, for |v| < 2^22: adding 1.5 * 2^23 leaves
   the integer in the low mantissa bits (PoCL's rint and convert_int16_rte are ~20
   instructions a vector, in software) */
#define ROUND(v) (as_int16((v) + 0x1.8p23f) - 0x4B400000)

/* One stage of the transpose: a and b as sixteen pairs each, even pairs to a, odd to b */
#define UNZIP(a, b)                                                             \
    do {                                                                        \
        const int16 t = a;                                                      \
        a = (int16)(t.even, b.even);                                            \
        b = (int16)(t.odd, b.odd);                                              \
    } while (0)

/* Columns c0.. c0 + tile - 1 of g * x (x when `normalize` is 0) into the local buffer,
 * shared out over the work-group by (column, super-block). The barriers fence off the
 * previous tile's readers and this tile's writers. */
inline void quantize_tile(__global const float *x, __global const int *xrows, __global const float *g,
                          int normalize, int k, int c0, int ncols, const int tile, __local short *xl)
{
    const int nsb = k / 256;
    __local int16 *xq = (__local int16 *)LOWBIT_INPUTS(xl, tile, k);
    __local int16 *xs = LOWBIT_SUMS(xl, tile, k);
    __local float *xd = LOWBIT_SCALES(xl, tile, k);
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int u = get_local_id(0); u < tile * nsb; u += get_local_size(0)) {
        const int c = u / nsb, s = u % nsb;
        __global const float *xc = x + (size_t)xrows[min(c0 + c, ncols - 1)] * k + 256 * s;
        /* the largest |x| as int bits (ordered like the floats they are), then x scaled
           to it, rounded, and packed into shorts */
        int16 m = 0;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const float16 v = normalize ? F16(i, xc) * F16(16 * s + i, g) : F16(i, xc);
            m = max(m, as_int16(v) & 0x7fffffff);
        }
        const float amax = as_float(hmax_int16(m));
        const float to_int = amax > 0.0f ? 32767.0f / amax : 0.0f;
        /* p[i]: inputs 32 i.. as 16 pairs of shorts; pair 16 i + l is 8u + f, u = 2i + l / 8,
           f = l % 8. Three stages swap i's bits with f's: p[f] then holds pairs 8u + f. */
        int16 p[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            float16 lo = F16(2 * i, xc), hi = F16(2 * i + 1, xc);
            if (normalize) {
                lo *= F16(16 * s + 2 * i, g);
                hi *= F16(16 * s + 2 * i + 1, g);
            }
            p[i] = __builtin_astype((short32)(convert_short16(ROUND(lo * to_int)), convert_short16(ROUND(hi * to_int))), int16);
        }
        UNZIP(p[0], p[1]); UNZIP(p[2], p[3]); UNZIP(p[4], p[5]); UNZIP(p[6], p[7]);
        UNZIP(p[0], p[2]); UNZIP(p[1], p[3]); UNZIP(p[4], p[6]); UNZIP(p[5], p[7]);
        UNZIP(p[0], p[4]); UNZIP(p[1], p[5]); UNZIP(p[2], p[6]); UNZIP(p[3], p[7]);
        __local int16 *o = xq + ((size_t)c * nsb + s) * 8;
        int16 sums = 0;
#pragma unroll
        for (int f = 0; f < 8; f++) {
            o[f] = p[f];
            sums += madd(as_short32(p[f]), (short32)1);
        }
        xs[c * nsb + s] = sums;
        xd[c * nsb + s] = amax / 32767.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}

/* One row's super-block: its 64 quant bytes as 16-bit lanes `w`, and from its record
   the sub-block scales (a lane each), the third bits (q3: a byte a lane, moved up two
   to be 4s), `offset` (what each input's per-16 sum is multiplied by, in units of
   `d_offset`) and the super-block scale d. */
__attribute__((always_inline)) inline void read_super(const int wtype, __global const uchar *qs,
        __global const float *dm, size_t sb, short32 *w, int16 *scale, short32 *h,
        int16 *offset, float *d, float *d_offset)
{
    *w = ((__global const short32 *)qs)[sb];
    if (wtype == WT_Q2) {
        __global const float *rec = dm + 6 * sb;  /* 24 bytes: 8-byte aligned */
        __global const uint2 *scb = (__global const uint2 *)rec;
        const int16 sc = convert_int16(as_uchar16((uint4)(scb[0], scb[1])));
        *scale = sc & 15;
        *offset = -(sc >> 4);
        *h = (short32)0;
        *d = rec[4];
        *d_offset = rec[5];
    } else {
        const float16 rec = ((__global const float16 *)dm)[sb];
        *h = __builtin_convertvector(__builtin_astype(rec.lo, uchar32), short32) << (short)2;
        *scale = convert_int16(as_char16(rec.s89ab));
        *offset = -4 * *scale;
        *d = *d_offset = rec.sc;
    }
}

/* Step f's quant of every lane */
#define LOWBIT_Q(f) (wtype == WT_Q2 ? (w >> (short)(2 * f)) & (short)3 \
    : ((w >> (short)(2 * f)) & (short)3) | ((h >> (short)(f)) & (short)4))

/* lane u: sub-block u's sum of quant * input, in two chains of multiply-adds (even and
   odd steps) added at the end: each vpdpwssd waits for the one before it on its sum, and
   integer adds give the same bits in any order */
__attribute__((always_inline)) inline int16 lowbit_dot(const int wtype, short32 w, short32 h,
                                                       __local const int16 *xv)
{
    int16 even = madd(LOWBIT_Q(0), as_short32(xv[0])), odd = madd(LOWBIT_Q(1), as_short32(xv[1]));
    even = madd_add(even, LOWBIT_Q(2), as_short32(xv[2]));
    odd = madd_add(odd, LOWBIT_Q(3), as_short32(xv[3]));
    even = madd_add(even, LOWBIT_Q(4), as_short32(xv[4]));
    odd = madd_add(odd, LOWBIT_Q(5), as_short32(xv[5]));
    even = madd_add(even, LOWBIT_Q(6), as_short32(xv[6]));
    return even + madd_add(odd, LOWBIT_Q(7), as_short32(xv[7]));
}

/* out0[c] = W[r0] . (g * x[c0+c]), out1[c] = W[r1] . (...), c < tile, from the local
   buffer quantize_tile filled. A wide tile decodes each row once: the compiler shares
   lowbit_dot's decoding between the columns. */
__attribute__((always_inline)) inline void pair_dot_lowbit(const int wtype, const int tile,
        __global const uchar *qs, __global const float *dm, int r0, int r1, int k,
        __local short *xl, float *out0, float *out1)
{
    const int nsb = k / 256;
    __local const int16 *xq = (__local const int16 *)LOWBIT_INPUTS(xl, tile, k);
    __local const int16 *xs = LOWBIT_SUMS(xl, tile, k);
    __local const float *xd = LOWBIT_SCALES(xl, tile, k);
    float16 a0[MAX_TILE], a1[MAX_TILE];
    for (int c = 0; c < tile; c++)
        a0[c] = a1[c] = (float16)0.0f;
    for (int s = 0; s < nsb; s++) {
        short32 w0, w1, h0, h1;
        int16 sc0, sc1, off0, off1;
        float d0, d1, dd0, dd1;
        prefetch_pair(qs, dm, r0, r1, nsb, s, 1, 64, wtype == WT_Q2 ? 24 : 64);
        read_super(wtype, qs, dm, (size_t)r0 * nsb + s, &w0, &sc0, &h0, &off0, &d0, &dd0);
        read_super(wtype, qs, dm, (size_t)r1 * nsb + s, &w1, &sc1, &h1, &off1, &d1, &dd1);
        for (int c = 0; c < tile; c++) {
            __local const int16 *xv = xq + ((size_t)c * nsb + s) * 8;
            const int16 sums = xs[c * nsb + s];
            const float dx = xd[c * nsb + s];
            const int16 i0 = lowbit_dot(wtype, w0, h0, xv) * sc0, i1 = lowbit_dot(wtype, w1, h1, xv) * sc1;
            if (wtype == WT_Q3) {  /* one scale: the offsets join the integers */
                a0[c] += convert_float16(i0 + off0 * sums) * (d0 * dx);
                a1[c] += convert_float16(i1 + off1 * sums) * (d1 * dx);
            } else {
                a0[c] += convert_float16(i0) * (d0 * dx) + convert_float16(off0 * sums) * (dd0 * dx);
                a1[c] += convert_float16(i1) * (d1 * dx) + convert_float16(off1 * sums) * (dd1 * dx);
            }
        }
    }
    for (int c = 0; c < tile; c++) {
        out0[c] = hsum16(a0[c]);
        out1[c] = hsum16(a1[c]);
    }
}

/* cpu/matmul.cl's fused kernels, with hooks that quantize each tile's inputs (every
   work-item, row or not, reaches quantize_tile's barriers) and take integer dots */
#define LOWBIT_ARGS , __local short *xl
#define LOWBIT_BEGIN(normalize)                                                 \
    __local float inv[MAX_COLS];                                                \
    column_scales(x, xrows, ncols, k, eps, normalize, inv);                     \
    const int r = 2 * get_global_id(0);                                         \
    const int active = r < rows;
#define LOWBIT_TILE_BEGIN(TILE, normalize)                                      \
    quantize_tile(x, xrows, g, normalize, k, c0, ncols, TILE, xl);              \
    if (!active)                                                                \
        continue;
#define LOWBIT_DOT(WTYPE, TILE, normalize, r0, r1, out0, out1)                  \
    pair_dot_lowbit(WTYPE, TILE, qs, dm, r0, r1, k, xl, out0, out1)

#define DEFINE_LOWBIT_MATMULS(NAME, WTYPE)                                      \
    DEFINE_FUSED(NAME, WTYPE, 1, LOWBIT_WG, LOWBIT_ARGS, LOWBIT_BEGIN, LOWBIT_TILE_BEGIN, LOWBIT_DOT) \
    DEFINE_FUSED(NAME, WTYPE, 2, LOWBIT_WG, LOWBIT_ARGS, LOWBIT_BEGIN, LOWBIT_TILE_BEGIN, LOWBIT_DOT) \
    DEFINE_FUSED(NAME, WTYPE, 4, LOWBIT_WG, LOWBIT_ARGS, LOWBIT_BEGIN, LOWBIT_TILE_BEGIN, LOWBIT_DOT) \
    DEFINE_FUSED(NAME, WTYPE, 8, LOWBIT_WG, LOWBIT_ARGS, LOWBIT_BEGIN, LOWBIT_TILE_BEGIN, LOWBIT_DOT)

#ifdef MATMUL_q2
DEFINE_LOWBIT_MATMULS(q2, WT_Q2)
#endif
#ifdef MATMUL_q3
DEFINE_LOWBIT_MATMULS(q3, WT_Q3)
#endif
