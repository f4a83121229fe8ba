/* CPU family: greedy sampling on the device, one work-item per sampled row (a 1x1
 * work-group: PoCL runs a work-group on one core, so a batch's rows spread over the
 * cores). The index of the largest logit, the lowest among equal maxima, as
 * common.cl's argmax returns; that kernel's strided scalar scan, a branch a logit,
 * took 0.19 ms of a 49152-logit row, 2% of a batch-1 step. Here each of 16 lanes
 * keeps the first maximum of its own positions (a strict compare), and the lanes
 * and the row's tail are settled at the end. */
__kernel void argmax_lanes(__global const float *logits, int n, __global int *ids)
{
    const int row = get_global_id(0);
    __global const float *z = logits + (size_t)row * n;
    const int16 lane = (int16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    float16 best = (float16)(-INFINITY);
    int16 at = (int16)(n);
    int j = 0;
    if ((size_t)row * n % 16 == 0)  /* float16 loads need the row 64-byte aligned */
        for (; j + 16 <= n; j += 16) {
            const float16 v = F16(0, z + j);
            const int16 better = v > best;
            best = select(best, v, better);
            at = select(at, lane + j, better);
        }
    const float *bl = (const float *)&best;
    const int *al = (const int *)&at;
    float b = -INFINITY;
    int i = n;
    for (int l = 0; l < 16; l++)
        if (bl[l] > b || (bl[l] == b && al[l] < i)) {
            b = bl[l];
            i = al[l];
        }
    for (; j < n; j++)  /* the tail: past every lane's positions */
        if (z[j] > b) {
            b = z[j];
            i = j;
        }
    ids[row] = i < n ? i : 0;
}
