/* What both kernel families share. Built after quant.cl. The host passes the
 * model's shape as -D constants: HEAD_DIM, N_HEADS, N_KV_HEADS, N_LAYERS,
 * BLOCK_SIZE, and ARGMAX_WG (the argmax work-group size, a power of two).
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
 * K/V are stored with vstore_half and read with vload_half (core OpenCL, no
 * cl_khr_fp16 needed); everything is computed in float.
 */

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
    load_block(WTYPE, qs, dm, (size_t)tokens[t] * nb + b, &lo, &hi);           \
    __global float16 *xt = (__global float16 *)(x + (size_t)t * d);             \
    xt[2 * b] = lo;                                                             \
    xt[2 * b + 1] = hi;                                                         \
}
FOR_EACH_WTYPE(DEFINE_EMBED)

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
                       __global half *kcache, __global half *vcache, int layer)
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
        vstore_half(x.x, tile + d * BLOCK_SIZE + slot, kcache);
        vstore_half(x.y, tile + (d + 1) * BLOCK_SIZE + slot, kcache);
    } else {                   /* V: [slot][d] */
        vstore_half2(x, 0, vcache + tile + slot * HEAD_DIM + d);
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
