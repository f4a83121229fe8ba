/* The parts of a Llama layer that are not matmuls: embedding, RoPE + KV store,
 * attention. Built after quant.cl and before matmul.cl. The host passes the
 * model's shape as -D constants: HEAD_DIM, N_HEADS, N_KV_HEADS, N_LAYERS,
 * BLOCK_SIZE.
 *
 * A step is a flat list of T tokens from any number of turns. Token t has a
 * position pos[t] and a turn index seq[t]; turn s owns the KV blocks
 * tables[s * max_blocks ...]. KV pool layout:
 *     K  [num_blocks][N_LAYERS][N_KV_HEADS][HEAD_DIM][BLOCK_SIZE]  float
 *     V  [num_blocks][N_LAYERS][N_KV_HEADS][BLOCK_SIZE][HEAD_DIM]  float
 * One block holds every layer's K (or V) for BLOCK_SIZE positions of one turn,
 * so swapping a block out is a single contiguous copy. K is stored transposed
 * within a block so attention gets 16 scores from 16-wide vector FMAs, without
 * a horizontal sum per position. BLOCK_SIZE is a multiple of 16.
 */

#define QKV_DIM ((N_HEADS + 2 * N_KV_HEADS) * HEAD_DIM)
#define Q_DIM (N_HEADS * HEAD_DIM)
#define KV_DIM (N_KV_HEADS * HEAD_DIM)
#define GROUP (N_HEADS / N_KV_HEADS)
#define HV (HEAD_DIM / 16)  /* float16 vectors per head */

/* offset of one (block, layer, kv head) tile of K or V: HEAD_DIM * BLOCK_SIZE floats */
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
    load_block(WTYPE, qs, dm, (size_t)tokens[t] * nb + b, &lo, &hi);           \
    __global float16 *xt = (__global float16 *)(x + (size_t)t * d);             \
    xt[2 * b] = lo;                                                             \
    xt[2 * b + 1] = hi;                                                         \
}
DEFINE_EMBED(q4_1, WT_Q4_1)
DEFINE_EMBED(q8_0, WT_Q8_0)
DEFINE_EMBED(f32, WT_F32)

/* ======================================================================== */
/* RoPE, and K/V into the paged cache                                        */
/* ======================================================================== */
/* qkv[t] = [q heads | k heads | v heads], rows of the fused QKV matmul. RoPE
 * rotates ADJACENT pairs (x[2i], x[2i+1]) of each q and k head by the angle
 * pos * inv_freq[i], inv_freq[i] = base^(-2i/HEAD_DIM) (GGUF llama checkpoints
 * are permuted for this convention):
 *     x'[2i]   = x[2i] cos - x[2i+1] sin
 *     x'[2i+1] = x[2i] sin + x[2i+1] cos
 * The QKV matmul calls this for the pair of rows (r, r+1) it computed for token
 * t: rotated q goes back to qkv, rotated k and plain v to the cache slot of pos. */
inline void rope_store(int r, float2 x, int t, int pos, int block,
                       __global const float *inv_freq, __global float *qkv,
                       __global float *kcache, __global float *vcache, int layer)
{
    if (r < Q_DIM + KV_DIM) {
        const int i = (r % HEAD_DIM) / 2;
        float c, s = sincos(pos * inv_freq[i], &c);
        x = (float2)(x.x * c - x.y * s, x.x * s + x.y * c);
    }
    if (r < Q_DIM) {
        *(__global float2 *)(qkv + (size_t)t * QKV_DIM + r) = x;
        return;
    }
    const int kr = (r - Q_DIM) % KV_DIM, d = kr % HEAD_DIM, slot = pos % BLOCK_SIZE;
    const size_t tile = kv_tile(block, layer, kr / HEAD_DIM);
    if (r < Q_DIM + KV_DIM) {  /* K, transposed: [d][slot] */
        kcache[tile + d * BLOCK_SIZE + slot] = x.x;
        kcache[tile + (d + 1) * BLOCK_SIZE + slot] = x.y;
    } else {                   /* V: [slot][d] */
        *(__global float2 *)(vcache + tile + slot * HEAD_DIM + d) = x;
    }
}

/* ======================================================================== */
/* Paged attention (decode and prefill chunks alike)                         */
/* ======================================================================== */
/* Token t attends to positions 0..pos[t] of its own turn (causal), reading K/V
 * through the turn's block table; the chunk's own K/V were stored by the QKV
 * matmul before this launch. Query head h reads KV head h / GROUP
 * (grouped-query attention).
 *     out = sum_p softmax_p(q . k_p / sqrt(HEAD_DIM)) v_p
 * computed in one pass, 16 positions at a time, with a running max m and
 * normaliser l (online softmax): each group of 16 rescales the sums once.
 * One work-item per (query head, token). */
inline float hmax16(float16 v)
{
    float8 a = fmax(v.lo, v.hi);
    float4 b = fmax(a.lo, a.hi);
    float2 c = fmax(b.lo, b.hi);
    return fmax(c.x, c.y);
}

__kernel void attention(__global const float *qkv, __global const int *pos,
                        __global const int *seq, __global const int *tables,
                        int max_blocks, __global const float *kcache,
                        __global const float *vcache, __global float *out,
                        int layer)
{
    const int h = get_global_id(0), t = get_global_id(1);
    const int kv_head = h / GROUP;
    __global const int *table = tables + seq[t] * max_blocks;
    const float scale = rsqrt((float)HEAD_DIM);
    const int16 lane = (int16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);

    float q[HEAD_DIM];
    float16 acc[HV];
    for (int d = 0; d < HEAD_DIM; d++)
        q[d] = qkv[(size_t)t * QKV_DIM + h * HEAD_DIM + d] * scale;
    for (int j = 0; j < HV; j++)
        acc[j] = (float16)0.0f;
    float m = -INFINITY, l = 0.0f;
    const int n = pos[t] + 1;
    for (int p0 = 0; p0 < n; p0 += 16) {
        const size_t tile = kv_tile(table[p0 / BLOCK_SIZE], layer, kv_head);
        const int slot0 = p0 % BLOCK_SIZE;
        /* scores of positions p0..p0+15; those past pos[t] are masked out */
        __global const float *k = kcache + tile + slot0;
        float16 score = (float16)0.0f;
        for (int d = 0; d < HEAD_DIM; d++)
            score += q[d] * F16(0, k + d * BLOCK_SIZE);
        score = select((float16)(-INFINITY), score, lane < (int16)(n - p0));
        const float m_new = fmax(m, hmax16(score));
        const float correction = exp(m - m_new);
        float16 w = exp(score - m_new);
        l = l * correction + hsum16(w);
        for (int j = 0; j < HV; j++)
            acc[j] *= correction;
        const float *wp = (const float *)&w;
        __global const float *v = vcache + tile + slot0 * HEAD_DIM;
        for (int s = 0; s < min(16, n - p0); s++)
            for (int j = 0; j < HV; j++)
                acc[j] += wp[s] * F16(j, v + s * HEAD_DIM);
        m = m_new;
    }
    for (int j = 0; j < HV; j++)
        ((__global float16 *)(out + (size_t)t * Q_DIM + h * HEAD_DIM))[j] = acc[j] / l;
}
