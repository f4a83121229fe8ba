/* CPU family: a one-token step's layer in one launch. Built after cpu/nibbles.cl and
 * cpu/attention.cl.
 *
 * A layer is five launches (QKV, attention, out, swiglu, down), each waiting for the one
 * before, and PoCL runs a launch's work-groups in chunks it sizes from the kernel's past
 * times: a small launch may run on one core while the other sleeps, and a core wakes
 * some microseconds after the launch before it ends. Here each core runs one work-group
 * of one work-item through the whole layer, and the two share each phase's rows by
 * claiming runs of row pairs from a counter:
 *
 *   QKV:       [q|k|v] = Wqkv . n(x), RoPE, the K/V store    (cpu/matmul.cl's qkv)
 *   attention: a query head at a time                        (cpu/attention.cl's attend)
 *   out:       x += Wo . att
 *   swiglu:    h = act(Wgate . n(x)) * (Wup . n(x))
 *   down:      x += Wdown . h
 *
 * A row pair's arithmetic is the matmul kernels' at a one-column tile (pair_dot_nibbles,
 * the same epilogues), so a step gives the same bits through either; the host takes this
 * kernel where every matrix of a layer is a nibble kind and the layer has no post-norms
 * and no Q/K norm (gpu/launches.py's CPULayer).
 *
 * Each phase has two counters in `sync`: the row pairs claimed and those done. A work-item
 * waits for a phase's last pairs only after the claims have run out, so it waits only on
 * runs another work-item has claimed and is running, which never wait themselves: the
 * layer finishes whether PoCL runs the work-groups side by side or one after another.
 * A work-item quantizes a phase's inputs before it claims; if it claims nothing (the
 * phase was done before it came), what it read is never used, even where a later phase
 * had begun to rewrite it. A layer's counters are its LAYER_COUNTERS ints of
 * `counters`; the host zeroes them all before each step. */

/* Row pairs a claim takes: RUN_PAIRS, one run of bytes (Q4_K's and Q6_K's pairs lie side by
   side, gpu/weights.py), but at least RUNS_PER_CORE claims a core a phase, so neither core
   waits long on the other's last. Each run's prefetches (cpu/matmul.cl) reach into the next
   run's bytes, which the other core may claim: runs of 8 pairs were no faster than five launches. */
#define RUN_PAIRS 64
#define RUNS_PER_CORE 4

#define LAYER_COUNTERS 16  /* ints a layer (a cache line), five phases' two */
#define CLAIMED 0   /* a phase's counters: row pairs (or heads) claimed, */
#define FINISHED 1  /* and finished */
#define PHASE(i) (2 * (i))
#define PHASE_QKV PHASE(0)
#define PHASE_ATTENTION PHASE(1)
#define PHASE_OUT PHASE(2)
#define PHASE_SWIGLU PHASE(3)
#define PHASE_DOWN PHASE(4)

inline void spin_wait(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __asm__ volatile("pause");
#endif
}

/* `n` of a phase's units finished: their stores before the count (OpenCL 1.2's atomics
   promise no order themselves; x86's locked adds would give it anyway) */
inline void finish(volatile __global int *sync, int phase, int n)
{
    mem_fence(CLK_GLOBAL_MEM_FENCE);
    atomic_add(sync + phase + FINISHED, n);
}

/* until `count` of a phase's units are finished, and their stores seen */
inline void await_phase(volatile __global int *sync, int phase, int count)
{
    while (atomic_add(sync + phase + FINISHED, 0) < count)
        spin_wait();
    mem_fence(CLK_GLOBAL_MEM_FENCE);
}

/* the first of the next `run` units of a phase of `count`, or -1 when all are claimed */
inline int claim(volatile __global int *sync, int phase, int count, int run)
{
    const int first = atomic_add(sync + phase + CLAIMED, run);
    return first < count ? first : -1;
}

inline int run_pairs(int pairs)
{
    return max(1, min(RUN_PAIRS, pairs / (RUNS_PER_CORE * (int)get_num_groups(0))));
}

/* one column's inputs to a matrix of kind `wtype` into `xl`, as its matmuls take them. The
   kernel meets no barrier (a work-group is one work-item): with the matmuls' barriers, in
   branches, PoCL took a minute to compile it, and a second without. */
inline void quantize_for(int wtype, __global const float *x, __global const int *xrows, __global const float *g,
                         int normalize, int k, __local uchar *xl)
{
#if INT8_INPUTS
    if (wtype == WT_Q4_K || wtype == WT_Q6_K) {
        quantize_super_columns(x, xrows, g, normalize, k, 0, 1, 1, wtype, xl);
        return;
    }
    if (INT8_NIBBLES && wtype == WT_Q4_1) {
        quantize_group_columns(x, xrows, g, normalize, k, 0, 1, 1, xl);
        return;
    }
#endif
    quantize_nibble_columns(x, xrows, g, normalize, k, 0, 1, 1, SUPER_KIND(wtype) ? 2 : 1, xl);
}

#define DOT_CASE(WTYPE)                                                         \
    case WTYPE:                                                                 \
        pair_dot_nibbles(WTYPE, 1, qs, dm, r0, r1, k, 0, 1, xl, out0, out1);    \
        return;

/* rows r0, r1 of a matrix of kind `wtype` times the column quantize_for put in `xl` */
inline void dot_pair(int wtype, __global const uchar *qs, __global const float *dm, int r0, int r1, int k,
                     __local uchar *xl, float *out0, float *out1)
{
    switch (wtype) {
#ifdef MATMUL_nib
    DOT_CASE(WT_Q4_1)
#endif
#ifdef MATMUL_nib5
    DOT_CASE(WT_Q5)
#endif
#ifdef MATMUL_nib6
    DOT_CASE(WT_Q6)
#endif
#ifdef MATMUL_nib8
    DOT_CASE(WT_Q8_0)
#endif
#ifdef MATMUL_nibq4k
    DOT_CASE(WT_Q4_K)
#endif
#ifdef MATMUL_nibq6k
    DOT_CASE(WT_Q6_K)
#endif
#ifdef MATMUL_nibq50
    DOT_CASE(WT_Q5_0)
#endif
    }
}

/* x += W . in (its `rows` rows, in unscaled: cpu/matmul.cl's matmul with accumulate) */
inline void add_product(int wtype, __global const uchar *qs, __global const float *dm, int rows, int k,
                        __global const float *in, __global const int *xrows, __global float *x,
                        __local uchar *xl, volatile __global int *sync, int phase)
{
    const int pairs = (rows + 1) / 2, run = run_pairs(pairs);
    quantize_for(wtype, in, xrows, in, 0, k, xl);
    for (int first; (first = claim(sync, phase, pairs, run)) >= 0;) {
        const int end = min(first + run, pairs);
        for (int p = first; p < end; p++) {
            const int r = 2 * p, r1 = min(r + 1, rows - 1);
            float o0[1], o1[1];
            dot_pair(wtype, qs, dm, r, r1, k, xl, o0, o1);
            x[r] += o0[0];
            if (r1 != r)
                x[r1] += o1[0];
        }
        finish(sync, phase, end - first);
    }
    await_phase(sync, phase, pairs);
}

/* The QKV stack in up to three parts of one kind each (gpu/weights.py's split stacks;
 * `rows1`, `rows2` 0 where it has fewer), their inputs in `xl` from `xl1` and `xl2` on. */
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void decode_layer(__global const uchar *qs0, __global const float *dm0, int kind0, int rows0,
                  __global const uchar *qs1, __global const float *dm1, int kind1, int rows1,
                  __global const uchar *qs2, __global const float *dm2, int kind2, int rows2,
                  __global const uchar *qs_out, __global const float *dm_out, int kind_out,
                  __global const uchar *qs_gate, __global const float *dm_gate, int kind_gate,
                  __global const uchar *qs_down, __global const float *dm_down, int kind_down,
                  __global const float *attn_norm, __global const float *ffn_norm, float eps,
                  int d_model, int d_ff, __global float *x, __global const int *xrows,
                  __global float *qkv, __global float *att, __global float *h,
                  __global const int *pos, __global const int *seq, __global const int *tables, int max_blocks,
                  __global const float *rope, __global half *kcache, __global half *vcache, int layer, int window,
                  volatile __global int *counters, __local uchar *xl, int xl1, int xl2)
{
    volatile __global int *sync = counters + LAYER_COUNTERS * layer;
    __local float inv[1];

    /* QKV: one claim counter over the parts' row pairs, each part read with its own inputs */
    column_scales_from(x, xrows, 0, 1, d_model, eps, 1, inv);
    quantize_for(kind0, x, xrows, attn_norm, 1, d_model, xl);
    if (rows1)
        quantize_for(kind1, x, xrows, attn_norm, 1, d_model, xl + xl1);
    if (rows2)
        quantize_for(kind2, x, xrows, attn_norm, 1, d_model, xl + xl2);
    {
        const int end0 = rows0 / 2, end1 = end0 + rows1 / 2, pairs = end1 + rows2 / 2;
        const int run = run_pairs(pairs);
        const int p = pos[0], block = tables[seq[0] * max_blocks + p / BLOCK_SIZE];
        for (int first; (first = claim(sync, PHASE_QKV, pairs, run)) >= 0;) {
            const int end = min(first + run, pairs);
            for (int q = first; q < end; q++) {
                float o0[1], o1[1];
                if (q < end0)
                    dot_pair(kind0, qs0, dm0, 2 * q, 2 * q + 1, d_model, xl, o0, o1);
                else if (q < end1)
                    dot_pair(kind1, qs1, dm1, 2 * (q - end0), 2 * (q - end0) + 1, d_model, xl + xl1, o0, o1);
                else
                    dot_pair(kind2, qs2, dm2, 2 * (q - end1), 2 * (q - end1) + 1, d_model, xl + xl2, o0, o1);
                rope_store(2 * q, (float2)(o0[0], o1[0]) * inv[0], 0, p, block, rope, qkv, kcache, vcache, layer);
            }
            finish(sync, PHASE_QKV, end - first);
        }
        await_phase(sync, PHASE_QKV, pairs);
    }

    for (int head; (head = claim(sync, PHASE_ATTENTION, N_HEADS, 1)) >= 0;) {
        attend(head, 0, qkv, pos, seq, tables, max_blocks, kcache, vcache, att, layer, window);
        finish(sync, PHASE_ATTENTION, 1);
    }
    await_phase(sync, PHASE_ATTENTION, N_HEADS);

    add_product(kind_out, qs_out, dm_out, d_model, Q_DIM, att, xrows, x, xl, sync, PHASE_OUT);

    /* swiglu: gate rows r, r + 1 and their up rows d_ff on (cpu/matmul.cl's swiglu) */
    column_scales_from(x, xrows, 0, 1, d_model, eps, 1, inv);
    quantize_for(kind_gate, x, xrows, ffn_norm, 1, d_model, xl);
    {
        const int pairs = d_ff / 2, run = run_pairs(pairs);
        for (int first; (first = claim(sync, PHASE_SWIGLU, pairs, run)) >= 0;) {
            const int end = min(first + run, pairs);
            for (int q = first; q < end; q++) {
                const int r = 2 * q;
                float g0[1], g1[1], u0[1], u1[1];
                dot_pair(kind_gate, qs_gate, dm_gate, r, r + 1, d_model, xl, g0, g1);
                const float16 act = activate_gates8(g0, g1, 0, 1, inv);
                dot_pair(kind_gate, qs_gate, dm_gate, d_ff + r, d_ff + r + 1, d_model, xl, u0, u1);
                store_swiglu8(act, u0, u1, 0, 1, inv, h + r, d_ff);
            }
            finish(sync, PHASE_SWIGLU, end - first);
        }
        await_phase(sync, PHASE_SWIGLU, pairs);
    }

    add_product(kind_down, qs_down, dm_down, d_model, d_ff, h, xrows, x, xl, sync, PHASE_DOWN);
}
