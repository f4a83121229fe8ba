/* What both kernel families share. Built after quant.cl. The host passes the
 * model's shape as -D constants: HEAD_DIM, N_HEADS, N_KV_HEADS, N_LAYERS,
 * BLOCK_SIZE, and ARGMAX_WG (the argmax work-group size, a power of two); and
 * its architecture's switches (gpu/model/arch.py): EMBED_SCALE, QK_NORM (0/1),
 * ACT_GELU (0/1), NORM_EPS.
 *
 * A step is a flat list of T tokens from any number of turns. Token t has a
 * position pos[t] and a turn index seq[t]; turn s owns the KV blocks
 * tables[s * max_blocks ...]. KV pool layout, half precision:
 *     K  [num_blocks][N_LAYERS][N_KV_HEADS][HEAD_DIM][BLOCK_SIZE]  half
 *     V  [num_blocks][N_LAYERS][N_KV_HEADS][BLOCK_SIZE][HEAD_DIM]  half
 * One block holds every layer's K (or V) for BLOCK_SIZE positions of one turn,
 * so swapping a block out is a single contiguous copy. K is transposed within a
 * block: a CPU work-item gets 16 positions' scores from one vector FMA per
 * dimension, and on a GPU neighbouring work-items (neighbouring positions) read
 * neighbouring addresses. V rows are contiguous per position, read along d.
 * K/V are stored as vstore_half rounds (store_halves: x86's F16C where the
 * compiler targets it) and read as vload_half reads them (load_halves16; core
 * OpenCL, no cl_khr_fp16 needed); everything is computed in float.
 */

#ifndef ROPE_TABLE
#define ROPE_TABLE 0  /* positions of the RoPE table after a layer's bias (rotate_pair) */
#endif

#define QKV_DIM ((N_HEADS + 2 * N_KV_HEADS) * HEAD_DIM)
#define Q_DIM (N_HEADS * HEAD_DIM)
#define KV_DIM (N_KV_HEADS * HEAD_DIM)
#define GROUP (N_HEADS / N_KV_HEADS)

/* offset of one (block, layer, kv head) tile of K or V: HEAD_DIM * BLOCK_SIZE halves */
inline size_t kv_tile(int block, int layer, int kv_head)
{
    return (((size_t)block * N_LAYERS + layer) * N_KV_HEADS + kv_head) * BLOCK_SIZE * HEAD_DIM;
}

/* ======================================================================== */
/* Embedding                                                                 */
/* ======================================================================== */
/* x[t, :] = dequantized row tokens[t] of the embedding table. One work-item per
 * (block of 32, token). */
#define DEFINE_EMBED(NAME, WTYPE)                                               \
__kernel void embed_##NAME(__global const uchar *qs, __global const float *dm,   \
                           __global const int *tokens, __global float *x, int d) \
{                                                                               \
    const int b = get_global_id(0), t = get_global_id(1);                       \
    const int nb = d / 32;                                                      \
    float16 lo, hi;                                                             \
    load_block(WTYPE, qs, dm, tokens[t], nb, b, &lo, &hi);                     \
    __global float16 *xt = (__global float16 *)(x + (size_t)t * d);             \
    xt[2 * b] = lo * EMBED_SCALE;                                               \
    xt[2 * b + 1] = hi * EMBED_SCALE;                                           \
}
FOR_EACH_WTYPE(DEFINE_EMBED)

/* ======================================================================== */
/* RoPE, and K/V into the paged cache                                        */
/* ======================================================================== */
/* qkv[t] = [q heads | k heads | v heads], rows of the fused QKV matmul. RoPE
 * rotates ADJACENT pairs (x[2i], x[2i+1]) of each q and k head by the angle
 * pos * inv_freq[i] (GGUF llama checkpoints are permuted for this convention,
 * and the host permutes NEOX models' Q/K rows into it):
 *     x'[2i]   = x[2i] cos - x[2i+1] sin
 *     x'[2i+1] = x[2i] sin + x[2i+1] cos
 * `rope` is the layer's constants: HEAD_DIM/2 frequencies inv_freq[i] (its own
 * base and scaling), then the QKV bias (zeros for models without one).
 * The QKV matmul calls this for the pair of rows (r, r+1) it computed for token
 * t: the bias is added, rotated q goes back to qkv, rotated k and plain v to
 * the cache slot of pos. With QK_NORM, q and k go back to qkv as they are and
 * qk_norm_rope finishes them once the whole head is there.
 * After the bias, `rope` holds (cos, sin) of every angle pos * inv_freq[i] for pos <
 * ROPE_TABLE, at [pos][i] (gpu/weights.py): PoCL's sincos took a quarter of the QKV
 * matmul's time at batch 1. Later positions compute it. */
inline void rotate_pair(int d, float2 *x, int pos, __global const float *rope)
{
    float c, s;
    if (pos < ROPE_TABLE) {
        const float2 a = ((__global const float2 *)(rope + HEAD_DIM / 2 + QKV_DIM))[pos * (HEAD_DIM / 2) + (d % HEAD_DIM) / 2];
        c = a.x;
        s = a.y;
    } else {
        s = sincos(pos * rope[(d % HEAD_DIM) / 2], &c);
    }
    *x = (float2)(x->x * c - x->y * s, x->x * s + x->y * c);
}

/* x.x to element i0 of p, x.y to i1, as halves rounded to nearest even, as vstore_half
   rounds. PoCL's vstore_half is a software routine (vstore_half2 a call of some 80
   instructions) where x86's F16C converts in one; rope_store is inlined, since a call
   per row pair in the QKV matmul's epilogue costs more than the rotation itself. */
#ifndef F16C_STORES  /* (tests build both) */
#if defined(__F16C__)
#define F16C_STORES 1
#else
#define F16C_STORES 0
#endif
#endif
#if F16C_STORES
typedef float f16c_floats __attribute__((__vector_size__(16)));
typedef short f16c_halves __attribute__((__vector_size__(16)));
#endif
inline void store_halves(float2 x, size_t i0, size_t i1, __global half *p)
{
#if F16C_STORES
    const f16c_halves h = __builtin_ia32_vcvtps2ph((f16c_floats)(float4)(x, 0.0f, 0.0f), 0);  /* 0: to nearest even */
    ((__global short *)p)[i0] = h[0];
    ((__global short *)p)[i1] = h[1];
#else
    vstore_half(x.x, i0, p);
    vstore_half(x.y, i1, p);
#endif
}

/* 16 halves from p as floats, exactly as vload_half16 reads them. PoCL's vload_half16
   converts 256 bits at a time and joins the two, a shuffle more in each step of
   attention's inner loops; where the compiler targets AVX-512 (x86 CPUs), one vcvtph2ps
   converts all 512. */
#ifndef WIDE_HALF_LOADS  /* (tests build both) */
#if defined(__AVX512F__)
#define WIDE_HALF_LOADS 1
#else
#define WIDE_HALF_LOADS 0
#endif
#endif
inline float16 load_halves16(__global const half *p)
{
#if WIDE_HALF_LOADS
    typedef short wide_halves __attribute__((__vector_size__(32)));
    typedef float wide_floats __attribute__((__vector_size__(64)));
    const ushort16 h = vload16(0, (__global const ushort *)p);
    const wide_floats none = __builtin_astype((float16)0.0f, wide_floats);  /* (no lane is masked) */
    /* 4: no rounding override, and none is needed: every half is a float */
    return __builtin_astype(__builtin_ia32_vcvtph2ps512_mask(__builtin_astype(h, wide_halves), none, (ushort)0xffff, 4), float16);
#else
    return vload_half16(0, p);
#endif
}

__attribute__((always_inline)) inline void rope_store(int r, float2 x, int t, int pos, int block,
                       __global const float *rope, __global float *qkv,
                       __global half *kcache, __global half *vcache, int layer)
{
    x += vload2(0, rope + HEAD_DIM / 2 + r);
    if (QK_NORM && r < Q_DIM + KV_DIM) {
        *(__global float2 *)(qkv + (size_t)t * QKV_DIM + r) = x;
        return;
    }
    if (r < Q_DIM + KV_DIM)
        rotate_pair(r, &x, pos, rope);
    if (r < Q_DIM) {
        *(__global float2 *)(qkv + (size_t)t * QKV_DIM + r) = x;
        return;
    }
    const int kr = (r - Q_DIM) % KV_DIM, d = kr % HEAD_DIM, slot = pos % BLOCK_SIZE;
    const size_t tile = kv_tile(block, layer, kr / HEAD_DIM);
    if (r < Q_DIM + KV_DIM) {  /* K, transposed: [d][slot] */
        store_halves(x, tile + d * BLOCK_SIZE + slot, tile + (d + 1) * BLOCK_SIZE + slot, kcache);
    } else {                   /* V: [slot][d] */
        const size_t at = tile + slot * HEAD_DIM + d;
        store_halves(x, at, at + 1, vcache);
    }
}

/* ======================================================================== */
/* Per-head RMSNorm of q and k, then RoPE and the K store (QK_NORM models)   */
/* ======================================================================== */
/* One work-item per (q or k head, token): x = x / rms(x) * w, rotate, then q
 * back to qkv and k to the cache slot of pos. */
__kernel void qk_norm_rope(__global float *qkv, __global const int *pos,
                           __global const int *seq, __global const int *tables,
                           int max_blocks, __global const float *rope,
                           __global const float *q_norm, __global const float *k_norm,
                           __global half *kcache, int layer)
{
    const int h = get_global_id(0), t = get_global_id(1), p = pos[t];
    __global float *x = qkv + (size_t)t * QKV_DIM + h * HEAD_DIM;
    __global const float *w = h < N_HEADS ? q_norm : k_norm;
    float ss = 0.0f;
    for (int d = 0; d < HEAD_DIM; d++)
        ss += x[d] * x[d];
    const float inv = rsqrt(ss / HEAD_DIM + NORM_EPS);
    const int slot = p % BLOCK_SIZE;
    const size_t tile = h < N_HEADS ? 0 : kv_tile(tables[seq[t] * max_blocks + p / BLOCK_SIZE], layer, h - N_HEADS);
    for (int d = 0; d < HEAD_DIM; d += 2) {
        float2 v = (float2)(x[d] * inv * w[d], x[d + 1] * inv * w[d + 1]);
        rotate_pair(d, &v, p, rope);
        if (h < N_HEADS) {
            x[d] = v.x;
            x[d + 1] = v.y;
        } else {
            store_halves(v, tile + d * BLOCK_SIZE + slot, tile + (d + 1) * BLOCK_SIZE + slot, kcache);
        }
    }
}

/* ======================================================================== */
/* Post-norm residual add (post_norms models), and the MLP's activation      */
/* ======================================================================== */
/* x[t] += y[t] / rms(y[t]) * w, one work-item per token. */
__kernel void add_rmsnorm(__global float *x, __global const float *y,
                          __global const float *w, int d)
{
    const int t = get_global_id(1);
    __global const float *yt = y + (size_t)t * d;
    __global float *xt = x + (size_t)t * d;
    float ss = 0.0f;
    for (int i = 0; i < d; i++)
        ss += yt[i] * yt[i];
    const float inv = rsqrt(ss / d + NORM_EPS);
    for (int i = 0; i < d; i++)
        xt[i] += yt[i] * inv * w[i];
}

/* act(gate) of the gated MLP: silu, or GELU's tanh form (Gemma) */
inline float activate(float g)
{
#if ACT_GELU
    return 0.5f * g * (1.0f + tanh(0.7978845608f * (g + 0.044715f * g * g * g)));
#else
    return g / (1.0f + exp(-g));
#endif
}

/* the same on 16 lanes (the CPU family's swiglu) */
inline float16 activate16(float16 g)
{
#if ACT_GELU
    return 0.5f * g * (1.0f + tanh(0.7978845608f * (g + 0.044715f * g * g * g)));
#else
    return g / (1.0f + exp(-g));
#endif
}

/* ======================================================================== */
/* Constrained decoding: token masks                                         */
/* ======================================================================== */
/* logits[rows[k], j] = -INFINITY wherever bit j % 32 of masks[k * words + j / 32]
 * is clear (gpu/masks.py: llguidance's layout), before argmax and sample_hot.
 * One work-item per (MASK_WORDS words, constrained row); a word of all ones, a
 * stretch of tokens all allowed, is skipped without touching the logits. */
#define MASK_WORDS 16
__kernel void apply_mask(__global float *logits, int n, __global const int *rows, __global const int *masks, int words)
{
    const int k = get_global_id(1);
    __global float *z = logits + (size_t)rows[k] * n;
    __global const int *m = masks + (size_t)k * words;
    const int w0 = get_global_id(0) * MASK_WORDS, w1 = min(words, w0 + MASK_WORDS);
    for (int w = w0; w < w1; w++) {
        const uint bits = (uint)m[w];
        if (bits == 0xffffffffu)
            continue;
        const int count = min(32, n - 32 * w);
        for (int b = 0; b < count; b++)
            if (!((bits >> b) & 1u))
                z[32 * w + b] = -INFINITY;
    }
}

/* ======================================================================== */
/* Greedy sampling on the device                                             */
/* ======================================================================== */
/* ids[row] = the index of the largest of logits[row, 0..n), the lowest index
 * among equal maxima (what numpy's argmax and the host sampler return). One
 * work-group of ARGMAX_WG work-items per row; each scans a strided share in
 * increasing order, then a tree picks the best (value, lowest index). */
__kernel __attribute__((reqd_work_group_size(ARGMAX_WG, 1, 1)))
void argmax(__global const float *logits, int n, __global int *ids)
{
    __local float best[ARGMAX_WG];
    __local int at[ARGMAX_WG];
    const int lid = get_local_id(0), row = get_group_id(0);
    __global const float *z = logits + (size_t)row * n;
    float v = -INFINITY;
    int i = n;
    for (int j = lid; j < n; j += ARGMAX_WG)
        if (z[j] > v || i == n) {
            v = z[j];
            i = j;
        }
    best[lid] = v;
    at[lid] = i;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = ARGMAX_WG / 2; s > 0; s >>= 1) {
        if (lid < s) {
            const float w = best[lid + s];
            const int k = at[lid + s];
            if (w > best[lid] || (w == best[lid] && k < at[lid])) {
                best[lid] = w;
                at[lid] = k;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0)
        ids[row] = at[0] < n ? at[0] : 0;
}

/* ======================================================================== */
/* Sampling at a temperature on the device                                   */
/* ======================================================================== */
/* For each row sampled at a temperature, what the host needs of it instead of
 * the whole row (gpu/devicesampling.py): one work-group of ARGMAX_WG work-items
 * per such row h, its logits row rows[h], params[2h] = 1 / temperature and
 * params[2h + 1] = the draw u in [0, 1), or -1 for a row sampled with top-p.
 * - A draw (no top-p): the token where the softmax's running sum, in token id
 *   order, first passes u times its total, into ids[rows[h]] (as gpu.sampling's
 *   _pick over the whole vocabulary).
 * - Top-p: the candidates, every token whose scaled logit is within `cut` of
 *   the row's largest (so that every token outside is less likely than every
 *   candidate), at most `cap`, in found[h]: count, the largest logit and the
 *   softmax's total (as float bits), cap, then (id, logit bits) pairs, in no order;
 *   ids[rows[h]] = -1 for the host to finish.
 * Each work-item sums a contiguous share of the row, so the running sum is in
 * token order: share totals, a prefix over them, then one work-item walks its
 * share to the token. */
#define FOUND_HEADER 4

inline float row_max(__local float *part, float v)
{
    const int lid = get_local_id(0);
    part[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = ARGMAX_WG / 2; s > 0; s >>= 1) {
        if (lid < s)
            part[lid] = fmax(part[lid], part[lid + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    v = part[0];
    barrier(CLK_LOCAL_MEM_FENCE);  /* part is reused next */
    return v;
}

__kernel __attribute__((reqd_work_group_size(ARGMAX_WG, 1, 1)))
void sample_hot(__global const float *logits, int n, __global const int *rows, __global const float *params,
                __global int *ids, __global int *found, int stride, int cap, float cut)
{
    __local float part[ARGMAX_WG];
    __local float before[ARGMAX_WG + 1];
    __local int count;
    const int lid = get_local_id(0), h = get_group_id(0), row = rows[h];
    __global const float *z = logits + (size_t)row * n;
    const float inv_t = params[2 * h], u = params[2 * h + 1];

    float top = -INFINITY;
    for (int j = lid; j < n; j += ARGMAX_WG)
        top = fmax(top, z[j]);
    top = row_max(part, top);

    const int share = (n + ARGMAX_WG - 1) / ARGMAX_WG;
    const int lo = min(n, lid * share), hi = min(n, lo + share);
    float mine = 0.0f;
    for (int j = lo; j < hi; j++)
        mine += exp((z[j] - top) * inv_t);
    part[lid] = mine;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid == 0) {
        float sum = 0.0f;
        for (int k = 0; k < ARGMAX_WG; k++) {
            before[k] = sum;
            sum += part[k];
        }
        before[ARGMAX_WG] = sum;
        count = 0;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    const float total = before[ARGMAX_WG];

    __global int *out = found + (size_t)h * stride;  /* (room for FOUND_HEADER + 2 * cap words) */
    if (u >= 0.0f) {
        /* The share the target falls in walks to its token; a target rounding
         * past every share's end goes to the last share that holds any mass. */
        const float target = u * total;
        int last = ARGMAX_WG - 1;
        while (last > 0 && part[last] <= 0.0f)
            last--;
        if (lo < hi && before[lid] <= target && (target < before[lid] + mine || lid == last)) {
            float run = before[lid];
            int pick = -1;
            for (int j = lo; j < hi; j++) {
                const float e = exp((z[j] - top) * inv_t);
                if (e > 0.0f)
                    pick = j;
                run += e;
                if (e > 0.0f && run > target)
                    break;
            }
            ids[row] = pick < 0 ? 0 : pick;
        }
    } else {
        for (int j = lid; j < n; j += ARGMAX_WG)
            if ((z[j] - top) * inv_t >= -cut) {
                const int k = atomic_inc(&count);
                if (k < cap) {
                    out[FOUND_HEADER + 2 * k] = j;
                    out[FOUND_HEADER + 2 * k + 1] = as_int(z[j]);
                }
            }
    }
    barrier(CLK_LOCAL_MEM_FENCE);  /* (every work-item reaches it: a row's branch is the work-group's) */
    if (u < 0.0f && lid == 0) {
        out[0] = count;
        out[1] = as_int(top);
        out[2] = as_int(total);
        out[3] = cap;
        ids[row] = -1;
    }
}
