/* GPU family: work-group reductions through local memory, and the post-norm
 * add built on them. Built after common.cl (NORM_EPS). WG is the
 * work-group size (a power of two). Every work-item must call these (they
 * hold barriers); on return out[i], i < n, holds the reduction of everyone's
 * v[i]. `scratch` holds WG * n floats; n <= WG. */

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

/* The post-norm residual add of post_norms models (Gemma 3):
 *     x[t] += y / rms(y) * w,   y = sum of nparts slices of parts, part_stride apart
 * y is the attention's per-KV-head output projections (attention.cl), or one
 * matmul's output (nparts 1). One work-group per token. */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void add_rmsnorm_parts(__global float *x, __global const float *parts, int nparts,
                       int part_stride, __global const float *w, int d)
{
    __local float scratch[WG];
    __local float total;
    const int lid = get_local_id(0), t = get_group_id(1);
    __global const float *yt = parts + (size_t)t * d;
    float ss[1] = {0.0f};
    for (int i = lid; i < d; i += WG) {
        float y = 0.0f;
        for (int p = 0; p < nparts; p++)
            y += yt[(size_t)p * part_stride + i];
        ss[0] += y * y;
    }
    wg_sum(ss, 1, scratch, &total);
    const float inv = rsqrt(total / d + NORM_EPS);
    for (int i = lid; i < d; i += WG) {
        float y = 0.0f;
        for (int p = 0; p < nparts; p++)
            y += yt[(size_t)p * part_stride + i];
        x[(size_t)t * d + i] += y * inv * w[i];
    }
}
