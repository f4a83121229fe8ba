/* GPU family: the reductions, each in one fixed order, and the post-norm add
 * built on them. Built after quant.cl and common.cl (NORM_EPS). WG is the
 * work-group size (a power of two).
 *
 * Batch invariance: a turn's logits must not depend on which other turns share
 * its step, or on how many, because pausing, resuming or batching a turn must
 * never change what it produces. So every per-row sum here has one order that
 * depends only on the row's own length (k, its positions) and on constants of
 * the device (WG), never on the batch: the decode and the tiled prefill matmuls
 * both go through block_dot, the lanes' order and the pairwise lane tree, and
 * both normalise through column_norms.
 */

/* Work-group reductions through local memory, halving: every work-item must call
 * them (they hold barriers); on return out[i], i < n, holds the reduction of
 * everyone's v[i]. `scratch` holds WG * n floats; n <= WG. */
inline void wg_reduce(const float *v, int n, int use_max, __local float *scratch, __local float *out)
{
    const int lid = get_local_id(0);
    for (int i = 0; i < n; i++)
        scratch[i * WG + lid] = v[i];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (lid < s)
            for (int i = 0; i < n; i++) {
                const float a = scratch[i * WG + lid], b = scratch[i * WG + lid + s];
                scratch[i * WG + lid] = use_max ? fmax(a, b) : a + b;
            }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid < n)
        out[lid] = scratch[lid * WG];
    barrier(CLK_LOCAL_MEM_FENCE);
}

inline void wg_sum(const float *v, int n, __local float *scratch, __local float *out)
{
    wg_reduce(v, n, 0, scratch, out);
}

inline void wg_max(const float *v, int n, __local float *scratch, __local float *out)
{
    wg_reduce(v, n, 1, scratch, out);
}

/* One block of 32 weights (w, already times the norm weights) against 32 inputs. */
inline float block_dot(float16 wlo, float16 whi, float16 xlo, float16 xhi)
{
    return hsum16(wlo * xlo + whi * xhi);
}

/* A row of nb blocks is summed by lpu lanes (a power of two <= nb): lane l adds
 * blocks l, l + lpu, ... in turn from 0, then the lanes' partials are added as a
 * pairwise tree, (l0 + l1) + (l2 + l3) and so on up: the order of a subgroup's
 * xor butterfly, which a work-group can also follow through local memory, and a
 * single work-item walking the blocks lane by lane (lane_block) through a stack
 * (tree_push). */
#define TREE_LEVELS 6  /* up to 32 lanes */

/* The q-th block of a row walked lane by lane: lane 0's blocks, then lane 1's... */
inline int lane_block(int q, int nb, int lpu)
{
    const int base = nb / lpu, big = (nb % lpu) * (base + 1);  /* the first nb % lpu lanes have one more */
    const int lane = q < big ? q / (base + 1) : nb % lpu + (q - big) / base;
    const int i = q < big ? q % (base + 1) : (q - big) % base;
    return lane + i * lpu;
}

/* Add lane `leaf`'s partial to the tree in t (leaves come in order 0, 1, ...);
 * after lpu leaves the sum is t[log2 lpu]. */
inline void tree_push(float *t, float v, int leaf)
{
    for (int level = 0; level < TREE_LEVELS; level++) {
        if (!((leaf >> level) & 1)) {
            t[level] = v;
            return;
        }
        v = t[level] + v;
    }
}

inline float tree_root(const float *t, int lpu)
{
    float root = t[0];
    for (int level = 1; level < TREE_LEVELS; level++)
        if (lpu >> level)
            root = t[level];
    return root;
}

/* The same tree over lpu partials in local memory, by one work-item: read once,
 * in order, through the stack (no writes back). */
inline float tree_local(__local const float *v, int lpu)
{
    float t[TREE_LEVELS];
    for (int i = 0; i < lpu; i++)
        tree_push(t, v[i], i);
    return tree_root(t, lpu);
}

/* The same tree across the lanes of a subgroup (lanes lpu-aligned within it): the
 * xor butterfly leaves the sum in every lane; a + b == b + a exactly, so each
 * lane's bits equal the tree's. SUBGROUPS (gpu/subgroups.py reads the device):
 * 0 none (tree_local instead), 1 cl_khr_subgroup_shuffle (OpenCL C 2.0 and up),
 * 2 emulated through local memory (tests: the butterfly's order and lanes on a
 * device without subgroups; every work-item must call it, as with a barrier). */
#if SUBGROUPS == 1
#define SHUFFLE_XOR(v, m, tmp) sub_group_shuffle_xor(v, (uint)(m))
#elif SUBGROUPS == 2
inline float emulated_shuffle_xor(float v, int m, __local float *tmp)
{
    const int lid = get_local_id(0);
    barrier(CLK_LOCAL_MEM_FENCE);
    tmp[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    return tmp[lid ^ m];
}
#define SHUFFLE_XOR(v, m, tmp) emulated_shuffle_xor(v, m, tmp)
#endif

#if SUBGROUPS
inline float tree_lanes(float v, int lpu, __local float *tmp)
{
    for (int m = 1; m < lpu; m <<= 1)
        v = v + SHUFFLE_XOR(v, m, tmp);
    return v;
}
#endif

/* The post-norm residual add of post_norms models (Gemma 3), common.cl's
 * add_rmsnorm on a work-group per token:
 *     x[t] += y[t] / rms(y[t]) * w */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void add_rmsnorm_wide(__global float *x, __global const float *y, __global const float *w, int d)
{
    __local float scratch[WG];
    __local float total;
    const int lid = get_local_id(0), t = get_group_id(1);
    __global const float *yt = y + (size_t)t * d;
    float ss[1] = {0.0f};
    for (int i = lid; i < d; i += WG)
        ss[0] += yt[i] * yt[i];
    wg_sum(ss, 1, scratch, &total);
    const float inv = rsqrt(total / d + NORM_EPS);
    for (int i = lid; i < d; i += WG)
        x[(size_t)t * d + i] += yt[i] * inv * w[i];
}
