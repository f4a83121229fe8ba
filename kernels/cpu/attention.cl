/* CPU family: paged attention (decode and prefill chunks alike). Built after
 * quant.cl and common.cl (the KV layout, GROUP, Q_DIM, QKV_DIM).
 */

#define HV (HEAD_DIM / 16)  /* 16-wide vectors per head */

/* ======================================================================== */
/* Paged attention (decode and prefill chunks alike)                         */
/* ======================================================================== */
/* Token t attends to positions 0..pos[t] of its own turn (causal), reading K/V
 * through the turn's block table; the chunk's own K/V were stored by the QKV
 * matmul before this launch. Query head h reads KV head h / GROUP
 * (grouped-query attention). On a sliding-window layer (window > 0) token t
 * sees only positions pos[t] - window < p <= pos[t].
 *     out = sum_p softmax_p(q . k_p / sqrt(HEAD_DIM)) v_p
 * computed in one pass, 16 positions at a time, with a running max m and
 * normaliser l (online softmax): each group of 16 rescales the sums once.
 * `attend` is one (query head, token): the `attention` kernel takes a work-item for
 * each, and cpu/layer.cl's decode_layer claims them; attention_group below, one work-item
 * per (KV head, token), gives the same bits. */
inline float hmax16(float16 v)
{
    float8 a = fmax(v.lo, v.hi);
    float4 b = fmax(a.lo, a.hi);
    float2 c = fmax(b.lo, b.hi);
    return fmax(c.x, c.y);
}

inline void attend(int h, int t, __global const float *qkv, __global const int *pos,
                   __global const int *seq, __global const int *tables,
                   int max_blocks, __global const half *kcache,
                   __global const half *vcache, __global float *out,
                   int layer, int window)
{
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
    const int first = window > 0 ? max(0, n - window) : 0;  /* first position seen */
    for (int p0 = first / 16 * 16; p0 < n; p0 += 16) {
        const size_t tile = kv_tile(table[p0 / BLOCK_SIZE], layer, kv_head);
        const int slot0 = p0 % BLOCK_SIZE;
        /* scores of positions p0..p0+15; those past pos[t] are masked out */
        __global const half *k = kcache + tile + slot0;
        float16 score = (float16)0.0f;
        for (int d = 0; d < HEAD_DIM; d++)
            score += q[d] * load_halves16(k + d * BLOCK_SIZE);
        score = select((float16)(-INFINITY), score, lane < (int16)(n - p0) && lane >= (int16)(first - p0));
        const float m_new = fmax(m, hmax16(score));
        /* the running max moves in few of a long context's groups: elsewhere the
           correction is e^0, 1, and scaling by it changes no bit */
        const float correction = m_new == m ? 1.0f : exp(m - m_new);
        float16 w = exp(score - m_new);
        l = l * correction + hsum16(w);
        if (m_new != m) {
#pragma unroll
            for (int j = 0; j < HV; j++)
                acc[j] *= correction;
        }
        const float *wp = (const float *)&w;
        __global const half *v = vcache + tile + slot0 * HEAD_DIM;
        for (int s = max(0, first - p0); s < min(16, n - p0); s++)
#pragma unroll
            for (int j = 0; j < HV; j++)
                acc[j] += wp[s] * load_halves16(v + s * HEAD_DIM + 16 * j);
        m = m_new;
    }
    for (int j = 0; j < HV; j++)
        ((__global float16 *)(out + (size_t)t * Q_DIM + h * HEAD_DIM))[j] = acc[j] / l;
}

__kernel void attention(__global const float *qkv, __global const int *pos,
                        __global const int *seq, __global const int *tables,
                        int max_blocks, __global const half *kcache,
                        __global const half *vcache, __global float *out,
                        int layer, int window)
{
    attend(get_global_id(0), get_global_id(1), qkv, pos, seq, tables, max_blocks, kcache, vcache, out, layer, window);
}

/* `attention` for a KV head's GROUP query heads at once, one work-item per (KV head,
 * token): each K and V vector is read and widened from half once for the group, not once
 * a query head. Each query head's sums see `attention`'s operations in the same order (V:
 * a 16-wide slice of the output at a time, over the positions in turn), so a step may take
 * either kernel (gpu/launches.py's CPUAttention: this one where the step has work-items
 * enough for the cores). */
__kernel void attention_group(__global const float *qkv, __global const int *pos,
                              __global const int *seq, __global const int *tables,
                              int max_blocks, __global const half *kcache,
                              __global const half *vcache, __global float *out,
                              int layer, int window)
{
    const int kv_head = get_global_id(0), t = get_global_id(1);
    __global const int *table = tables + seq[t] * max_blocks;
    const float scale = rsqrt((float)HEAD_DIM);
    const int16 lane = (int16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);

    float q[GROUP][HEAD_DIM];
    float16 acc[GROUP][HV];
    float m[GROUP], l[GROUP];
    for (int i = 0; i < GROUP; i++) {
        const int h = kv_head * GROUP + i;
        for (int d = 0; d < HEAD_DIM; d++)
            q[i][d] = qkv[(size_t)t * QKV_DIM + h * HEAD_DIM + d] * scale;
        for (int j = 0; j < HV; j++)
            acc[i][j] = (float16)0.0f;
        m[i] = -INFINITY;
        l[i] = 0.0f;
    }
    const int n = pos[t] + 1;
    const int first = window > 0 ? max(0, n - window) : 0;  /* first position seen */
    for (int p0 = first / 16 * 16; p0 < n; p0 += 16) {
        const size_t tile = kv_tile(table[p0 / BLOCK_SIZE], layer, kv_head);
        const int slot0 = p0 % BLOCK_SIZE;
        __global const half *k = kcache + tile + slot0;
        float16 score[GROUP], w[GROUP];
#pragma unroll
        for (int i = 0; i < GROUP; i++)
            score[i] = (float16)0.0f;
        for (int d = 0; d < HEAD_DIM; d++) {
            const float16 kd = load_halves16(k + d * BLOCK_SIZE);
#pragma unroll
            for (int i = 0; i < GROUP; i++)
                score[i] += q[i][d] * kd;
        }
        for (int i = 0; i < GROUP; i++) {
            const float16 s = select((float16)(-INFINITY), score[i], lane < (int16)(n - p0) && lane >= (int16)(first - p0));
            const float m_new = fmax(m[i], hmax16(s));
            const float correction = m_new == m[i] ? 1.0f : exp(m[i] - m_new);  /* (as in attend) */
            w[i] = exp(s - m_new);
            l[i] = l[i] * correction + hsum16(w[i]);
            if (m_new != m[i])
                for (int j = 0; j < HV; j++)
                    acc[i][j] *= correction;
            m[i] = m_new;
        }
        __global const half *v = vcache + tile + slot0 * HEAD_DIM;
        const int s0 = max(0, first - p0), s1 = min(16, n - p0);
        for (int j = 0; j < HV; j++)
            for (int s = s0; s < s1; s++) {
                const float16 vj = load_halves16(v + s * HEAD_DIM + 16 * j);
#pragma unroll
                for (int i = 0; i < GROUP; i++)
                    acc[i][j] += ((const float *)&w[i])[s] * vj;
            }
    }
    for (int i = 0; i < GROUP; i++)
        for (int j = 0; j < HV; j++)
            ((__global float16 *)(out + (size_t)t * Q_DIM + (kv_head * GROUP + i) * HEAD_DIM))[j] = acc[i][j] / l[i];
}
