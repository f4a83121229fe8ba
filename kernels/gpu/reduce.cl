/* GPU family: work-group reductions through local memory. WG is the
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
