/* GPU family: paged attention. Built after quant.cl, common.cl and
 * gpu/reduce.cl; the host passes WG, MAX_SPLITS and SPLIT_SPAN.
 *
 * Work-group (KV head, token, split). The query heads of the KV head's group
 * (grouped-query attention) share every K and V load. The positions token t
 * sees, first..pos[t] (first = 0, or pos[t] - window + 1 on a sliding-window
 * layer, window > 0), are cut into splits of SPLIT_SPAN positions each
 * (flash-decoding: a long context keeps many work-groups busy even for one
 * token), the span doubling, tripling... past MAX_SPLITS * SPLIT_SPAN
 * positions. A fixed span, not a count chosen per step, because a token's sums
 * must not depend on its batch-mates (reduce.cl): the launch has as many
 * splits as its longest token needs, and a token's surplus work-groups have
 * an empty range. A split processes its range WG positions at a time,
 * flash-attention style:
 *   scores   work-item i takes position p0 + i: its K column (K is stored
 *            transposed, so neighbouring work-items read neighbouring halves)
 *            against each query head of the group;
 *   softmax  the chunk's max and sum per head by work-group reductions, with a
 *            running max m and normaliser l: earlier chunks rescale once;
 *   P.V      work-item i owns outputs (head, d) = i, i + WG, ...: neighbouring
 *            work-items read neighbouring halves of each V row.
 * With more than one split, each writes its running (m, l, unnormalised output)
 * per head to `partial` and counts itself done on the (token, KV head) counter;
 * the last to finish combines them,
 *     o = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s,   M = max_s m_s,
 * resets the counter and writes the group's outputs (the "last block" reduction
 * pattern). No work-item returns early: every one reaches every barrier. The
 * output projection is the next launch, an ordinary matmul over every row of
 * Wo: fused in here it would run on only as many work-groups as the model has
 * KV heads.
 */

#define GH (GROUP * HEAD_DIM)      /* outputs of one KV head's query group */
#define ACC ((GH + WG - 1) / WG)   /* outputs per work-item */
#define SPLIT_FLOATS (GROUP * (2 + HEAD_DIM))  /* m, l, output of each head of a group */

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void attention(__global const float *qkv, __global const int *pos, __global const int *seq,
               __global const int *tables, int max_blocks, __global const half *kcache,
               __global const half *vcache, int layer, int window, __global float *att,
               __global float *partial, __global int *counters)
{
    __local float q[GH];
    __local float p[GROUP][WG];
    __local float scratch[GROUP * WG];
    __local float chunk[GROUP];
    __local int last[1];  /* an array: clang took a scalar for a private one */
    const int lid = get_local_id(0), kvh = get_group_id(0), t = get_group_id(1);
    const int split = get_group_id(2);
    __global const int *table = tables + seq[t] * max_blocks;
    const int n = pos[t] + 1, first = window > 0 ? max(0, n - window) : 0;
    /* a fixed span per split, so the splits depend on this token alone */
    const int seen = n - first, spans = (seen + SPLIT_SPAN - 1) / SPLIT_SPAN;
    const int span = SPLIT_SPAN * ((spans + MAX_SPLITS - 1) / MAX_SPLITS);
    const int splits = (seen + span - 1) / span;
    const int begin = first + split * span, end = min(n, begin + span);
    const float scale = rsqrt((float)HEAD_DIM);
    for (int j = lid; j < GH; j += WG)
        q[j] = qkv[(size_t)t * QKV_DIM + kvh * GH + j] * scale;
    float acc[ACC], m[GROUP], l[GROUP], corr[GROUP], s[GROUP];
    for (int i = 0; i < ACC; i++)
        acc[i] = 0.0f;
    for (int h = 0; h < GROUP; h++) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    /* a longer token may need more splits than this one: this work-group's range
       is then empty, and it goes through the barriers below with nothing to do */
    for (int p0 = begin; p0 < end; p0 += WG) {
        const int at = p0 + lid;
        for (int h = 0; h < GROUP; h++)
            s[h] = at < end ? 0.0f : -INFINITY;
        if (at < end) {
            __global const half *kp = kcache + kv_tile(table[at / BLOCK_SIZE], layer, kvh)
                                      + at % BLOCK_SIZE;
            for (int d = 0; d < HEAD_DIM; d++) {
                const float kd = vload_half(d * BLOCK_SIZE, kp);
                for (int h = 0; h < GROUP; h++)
                    s[h] += q[h * HEAD_DIM + d] * kd;
            }
        }
        wg_max(s, GROUP, scratch, chunk);
        for (int h = 0; h < GROUP; h++) {
            const float m_new = fmax(m[h], chunk[h]);
            corr[h] = exp(m[h] - m_new);
            m[h] = m_new;
            s[h] = exp(s[h] - m_new);
            p[h][lid] = s[h];
        }
        wg_sum(s, GROUP, scratch, chunk);  /* its barriers publish p too */
        for (int h = 0; h < GROUP; h++)
            l[h] = l[h] * corr[h] + chunk[h];
        const int len = min(WG, end - p0);
        for (int i = 0; i < ACC; i++) {
            const int j = lid + i * WG, h = j / HEAD_DIM, d = j % HEAD_DIM;
            if (j >= GH)
                break;
            float a = acc[i] * corr[h];
            for (int e = 0; e < len; e++) {
                const int ps = p0 + e;
                __global const half *vp = vcache + kv_tile(table[ps / BLOCK_SIZE], layer, kvh)
                                          + (ps % BLOCK_SIZE) * HEAD_DIM;
                a += p[h][e] * vload_half(d, vp);
            }
            acc[i] = a;
        }
        barrier(CLK_LOCAL_MEM_FENCE);  /* before the next chunk rewrites p */
    }
    const size_t pair = (size_t)t * N_KV_HEADS + kvh;
    __global float *out = att + (size_t)t * Q_DIM + kvh * GH;
    if (splits == 1 && split == 0) {
        for (int i = 0; i < ACC; i++) {
            const int j = lid + i * WG;
            if (j < GH)
                out[j] = acc[i] / l[j / HEAD_DIM];
        }
    } else if (split < splits) {
        __global float *mine = partial + (pair * MAX_SPLITS + split) * SPLIT_FLOATS;
        for (int i = 0; i < ACC; i++) {
            const int j = lid + i * WG;
            if (j < GH)
                mine[2 * GROUP + j] = acc[i];
        }
        for (int h = 0; h < GROUP; h++)
            if (lid == h) {
                mine[h] = m[h];
                mine[GROUP + h] = l[h];
            }
        mem_fence(CLK_GLOBAL_MEM_FENCE);
    }
    /* every work-item of every work-group reaches both barriers: with a return
       before them, PoCL 3.1's results varied run to run on two threads */
    barrier(CLK_GLOBAL_MEM_FENCE);
    if (lid == 0)
        last[0] = splits > 1 && split < splits && atomic_inc(counters + pair) == splits - 1;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (last[0]) {
        if (lid == 0)
            counters[pair] = 0;  /* ready for the next launch */
        /* volatile: read what the other work-groups wrote, not a stale cache */
        volatile __global const float *all = partial + pair * MAX_SPLITS * SPLIT_FLOATS;
        for (int i = 0; i < ACC; i++) {
            const int j = lid + i * WG, h = j / HEAD_DIM;
            if (j >= GH)
                break;
            float top = -INFINITY, sum = 0.0f, o = 0.0f;
            for (int q = 0; q < splits; q++)
                top = fmax(top, all[q * SPLIT_FLOATS + h]);
            for (int q = 0; q < splits; q++) {
                volatile __global const float *its = all + q * SPLIT_FLOATS;
                const float w = exp(its[h] - top);
                sum += w * its[GROUP + h];
                o += w * its[2 * GROUP + j];
            }
            out[j] = o / sum;
        }
    }
}
