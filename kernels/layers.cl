/* The parts of a Llama layer that are not matmuls: embedding, RoPE + KV store,
 * attention. Built after quant.cl and before matmul.cl. The host passes the
 * model's shape as -D constants: HEAD_DIM, N_HEADS, N_KV_HEADS, N_LAYERS,
 * BLOCK_SIZE.
 *
 * A step is a flat list of T tokens from any number of turns. Token t has a
 * position pos[t] and a turn index seq[t]; turn s owns the KV blocks
 * tables[s * max_blocks ...]. KV pool layout (K and V alike):
 *     [num_blocks][N_LAYERS][N_KV_HEADS][BLOCK_SIZE][HEAD_DIM]  float
 * so one block holds every layer's K (or V) for BLOCK_SIZE positions of one
 * turn and swapping a block out is a single contiguous copy.
 */

#define QKV_DIM ((N_HEADS + 2 * N_KV_HEADS) * HEAD_DIM)
#define Q_DIM (N_HEADS * HEAD_DIM)
#define KV_DIM (N_KV_HEADS * HEAD_DIM)
#define GROUP (N_HEADS / N_KV_HEADS)
#define HV (HEAD_DIM / 16)  /* float16 vectors per head */

inline size_t kv_index(int block, int layer, int kv_head, int slot)
{
    return ((((size_t)block * N_LAYERS + layer) * N_KV_HEADS + kv_head)
            * BLOCK_SIZE + slot) * HEAD_DIM;
}

/* ======================================================================== */
/* Embedding                                                                 */
/* ======================================================================== */
/* x[t, :] = dequantized row tokens[t] of the embedding table. One work-item per
 * (block of 32, token). */
#define DEFINE_EMBED(NAME, WTYPE)                                               \
__kernel void embed_##NAME(__global const uchar *qs, __global const half *dm,   \
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
    const int kr = (r - Q_DIM) % KV_DIM;
    __global float *cache = r < Q_DIM + KV_DIM ? kcache : vcache;
    *(__global float2 *)(cache + kv_index(block, layer, kr / HEAD_DIM, pos % BLOCK_SIZE) + kr % HEAD_DIM) = x;
}

/* ======================================================================== */
/* Paged attention (decode and prefill chunks alike)                         */
/* ======================================================================== */
/* Token t attends to positions 0..pos[t] of its own turn (causal), reading K/V
 * through the turn's block table; the chunk's own K/V were stored above.
 * Query head h reads KV head h / GROUP (grouped-query attention).
 *     out = sum_p softmax_p(q . k_p / sqrt(HEAD_DIM)) v_p
 * computed in one pass with a running max m and normaliser l (online softmax).
 * One work-item per (query head, token). */
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

    float16 q[HV], acc[HV];
    for (int j = 0; j < HV; j++) {
        q[j] = F16(j, qkv + (size_t)t * QKV_DIM + h * HEAD_DIM) * scale;
        acc[j] = (float16)0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    const int n = pos[t] + 1;
    for (int p0 = 0; p0 < n; p0 += BLOCK_SIZE) {
        const size_t base = kv_index(table[p0 / BLOCK_SIZE], layer, kv_head, 0);
        const int slots = min(BLOCK_SIZE, n - p0);
        /* a block at a time: its scores and their max first, so the running
         * sums are rescaled once per block rather than once per position */
        float score[BLOCK_SIZE], m_new = m;
        for (int s = 0; s < slots; s++) {
            __global const float *k = kcache + base + s * HEAD_DIM;
            float16 prod = q[0] * F16(0, k);
            for (int j = 1; j < HV; j++)
                prod += q[j] * F16(j, k);
            score[s] = hsum16(prod);
            m_new = fmax(m_new, score[s]);
        }
        const float correction = exp(m - m_new);
        l *= correction;
        for (int j = 0; j < HV; j++)
            acc[j] *= correction;
        for (int s = 0; s < slots; s++) {
            __global const float *v = vcache + base + s * HEAD_DIM;
            const float w = exp(score[s] - m_new);
            l += w;
            for (int j = 0; j < HV; j++)
                acc[j] += w * F16(j, v);
        }
        m = m_new;
    }
    for (int j = 0; j < HV; j++)
        ((__global float16 *)(out + (size_t)t * Q_DIM + h * HEAD_DIM))[j] = acc[j] / l;
}
