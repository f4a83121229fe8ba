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
from gpu.launches import attention_kernel
from kernels import source

HEAD_DIM, BLOCK, LAYERS, LAYER = 32, 16, 2, 1


@pytest.fixture(scope="module")
def device():
    return select_device()


def build(device, heads: int, kv_heads: int) -> cl.Program:
    family = CPUFamily(device)
    shape = ["-DEMBED_SCALE=1.0f", "-DQK_NORM=0", "-DACT_GELU=0", "-DNORM_EPS=1e-6f", f"-DHEAD_DIM={HEAD_DIM}",
             f"-DN_HEADS={heads}", f"-DN_KV_HEADS={kv_heads}", f"-DN_LAYERS={LAYERS}", f"-DBLOCK_SIZE={BLOCK}",
             "-DARGMAX_WG=16", f"-DWG={family.wg}", f"-DLOWBIT_WG={family.LOWBIT_WG}", "-DMAX_COLS=64"]  # fmt: skip
    # only the sources attention needs: the family's whole, every matmul, built in ~10 s cold
    return device.build("\n".join(map(source, ("quant", "common", "cpu/attention"))), shape)


def numpy_attention(q, k, v, positions, window: int) -> np.ndarray:
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
    out = cl.Buffer(ctx, flags.READ_WRITE, q.nbytes)
    args = (buffer(qkv), buffer(positions), buffer(np.zeros(len(positions), np.int32)), buffer(table), np.int32(n_blocks),
            buffer(kcache), buffer(vcache), out, np.int32(LAYER), np.int32(window))  # fmt: skip
    got = {}
    for kernel, items in (("attention_group", kv_heads), ("attention", heads)):
        result = np.full_like(q, np.nan)
        cl.enqueue_copy(device.queue, out, result)
        getattr(program, kernel)(device.queue, (items, len(positions)), (1, 1), *args)
        cl.enqueue_copy(device.queue, result, out)
        got[kernel] = result
    assert got["attention_group"].tobytes() == got["attention"].tobytes()
    want = numpy_attention(q, k.astype(np.float64), v.astype(np.float64), positions, window)
    np.testing.assert_allclose(got["attention_group"], want, rtol=1e-4, atol=1e-4)


def test_attention_goes_by_kv_head_only_for_large_groups_and_wide_steps() -> None:
    """By KV head where one serves GROUPED_MIN query heads or more and the step has
    work-items enough for the cores; a batch-1 decode keeps a work-item a query head."""
    assert [attention_kernel(12, 2, t, 8) for t in (1, 3, 4, 256)] == ["attention", "attention", "attention_group", "attention_group"]
    assert [attention_kernel(9, 3, t, 8) for t in (1, 256)] == ["attention", "attention"]
    assert attention_kernel(14, 2, 256, 8) == "attention_group"


def test_a_prompt_by_kv_head_matches_the_reference_and_the_bits_by_query_head(tmp_path) -> None:
    """A tiny model whose KV head serves six query heads: its 40-token prompt goes by KV head
    (a step of 40 work-items), its logits match the NumPy model, and are the bits the same
    prompt gives a work-item a query head."""
    from reference import ReferenceModel

    from gpu.engine import OpenCLEngine
    from gpu.launches import CPUAttention
    from gpu.model.load import load_model
    from gpu.model.synthetic import write_tiny_gguf
    from runtime.scheduling.work import Work

    model = load_model(write_tiny_gguf(tmp_path / "gqa6.gguf", d_model=96, n_heads=6, n_kv_heads=1))
    engine = OpenCLEngine(model, num_blocks=8, kernels="cpu")
    tokens = np.random.default_rng(6).integers(0, engine.config.vocab_size, 40).tolist()
    work = Work(turn=0, tokens=tokens, start=0, block_table=list(range(3)), sample=True)
    launches = [launch for launch in engine.launches.layers if isinstance(launch, CPUAttention)]
    assert {attention_kernel(launch.n_heads, launch.n_kv_heads, 40, launch.min_items) for launch in launches} == {"attention_group"}
    grouped = engine.step_logits([work])[0]
    reference = ReferenceModel(model)
    want = reference.forward(tokens, 0, reference.new_cache())[-1]
    assert np.abs(grouped - want).max() / np.abs(want).max() < 2e-3
    for launch in launches:
        launch.min_items = 10**6  # a work-item a query head
    assert engine.step_logits([work])[0].tobytes() == grouped.tobytes()
