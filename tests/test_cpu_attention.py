"""The CPU family's two attention kernels (kernels/cpu/attention.cl): `attention`, a
work-item per query head, and `attention_group`, one per KV head for its query heads,
against NumPy and against each other bit for bit (a step takes either, by its width), with
grouped queries, positions that start and end inside a 16-position tile, and a sliding
window."""

import numpy as np
import pyopencl as cl
import pytest

from gpu.device import select_device
from gpu.families import CPUFamily
from gpu.launches import CPUAttention

HEAD_DIM, BLOCK, LAYERS, LAYER = 32, 16, 2, 1


@pytest.fixture(scope="module")
def device():
    return select_device()


def build(device, heads: int, kv_heads: int) -> cl.Program:
    family = CPUFamily(device)
    shape = ["-DEMBED_SCALE=1.0f", "-DQK_NORM=0", "-DACT_GELU=0", "-DNORM_EPS=1e-6f", f"-DHEAD_DIM={HEAD_DIM}",
             f"-DN_HEADS={heads}", f"-DN_KV_HEADS={kv_heads}", f"-DN_LAYERS={LAYERS}", f"-DBLOCK_SIZE={BLOCK}",
             "-DARGMAX_WG=16", f"-DWG={family.wg}", f"-DLOWBIT_WG={family.LOWBIT_WG}", "-DMAX_COLS=64"]  # fmt: skip
    return device.build(family.source(), shape)


def reference(q, k, v, positions, window: int) -> np.ndarray:
    """Each token's softmax attention over its turn's positions (the window's last)."""
    heads, kv_heads = q.shape[1], k.shape[0]
    out = np.zeros_like(q, dtype=np.float64)
    for t, p in enumerate(positions):
        first = max(0, p + 1 - window) if window else 0
        for h in range(heads):
            kh = h // (heads // kv_heads)
            scores = k[kh, first : p + 1] @ q[t, h] / np.sqrt(HEAD_DIM)
            w = np.exp(scores - scores.max())
            out[t, h] = (w / w.sum()) @ v[kh, first : p + 1]
    return out


@pytest.mark.parametrize(("heads", "kv_heads", "window"), [(6, 2, 0), (4, 1, 0), (3, 3, 0), (6, 2, 21)])
def test_attention_by_kv_head_gives_the_bits_of_attention_by_query_head(device, heads: int, kv_heads: int, window: int) -> None:  # noqa: E501
    program = build(device, heads, kv_heads)
    rng = np.random.default_rng(heads + window)
    positions = np.array([0, 5, 16, 17, 40, 47, 48, 70], np.int32)  # one turn's tokens, some mid-tile
    n_blocks = 5
    table = rng.permutation(n_blocks).astype(np.int32)  # its blocks out of order
    k = rng.standard_normal((kv_heads, n_blocks * BLOCK, HEAD_DIM)).astype(np.float16)
    v = rng.standard_normal((kv_heads, n_blocks * BLOCK, HEAD_DIM)).astype(np.float16)
    # the caches: tiles of (block, layer, kv head); K a tile [dim][slot], V [slot][dim]
    kcache = np.zeros((n_blocks, LAYERS, kv_heads, HEAD_DIM, BLOCK), np.float16)
    vcache = np.zeros((n_blocks, LAYERS, kv_heads, BLOCK, HEAD_DIM), np.float16)
    for i, block in enumerate(table):
        kcache[block, LAYER] = k[:, i * BLOCK : (i + 1) * BLOCK].transpose(0, 2, 1)
        vcache[block, LAYER] = v[:, i * BLOCK : (i + 1) * BLOCK]
    q = rng.standard_normal((len(positions), heads, HEAD_DIM)).astype(np.float32) * 2
    qkv = np.concatenate([q.reshape(len(positions), -1), np.zeros((len(positions), 2 * kv_heads * HEAD_DIM), np.float32)], axis=1)
    ctx, flags = device.context, cl.mem_flags
    buffer = lambda a: cl.Buffer(ctx, flags.READ_ONLY | flags.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(a))  # noqa: E731
    out = cl.Buffer(ctx, flags.WRITE_ONLY, q.nbytes)
    args = (buffer(qkv), buffer(positions), buffer(np.zeros(len(positions), np.int32)), buffer(table), np.int32(n_blocks),
            buffer(kcache), buffer(vcache), out, np.int32(LAYER), np.int32(window))  # fmt: skip
    got = {}
    for min_items in (1, 10**6):  # by KV head, then by query head
        launch = CPUAttention(program, heads, kv_heads, min_items, *args)
        assert launch.kernel_for(len(positions)) == ("attention_group" if min_items == 1 else "attention")
        launch.enqueue(device.queue, len(positions))
        result = np.empty_like(q)
        cl.enqueue_copy(device.queue, result, out)
        got[min_items] = result
    assert got[1].tobytes() == got[10**6].tobytes()
    want = reference(q, k.astype(np.float64), v.astype(np.float64), positions, window)
    np.testing.assert_allclose(got[1], want, rtol=1e-4, atol=1e-4)
