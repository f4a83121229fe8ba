"""The device kinds against the gguf package: random blocks of every quantized type, packed
as gpu/weights.py uploads them and read back through kernels/quant.cl's load_block (the
embedding kernel, which dequantizes whole rows), equal gguf's own dequantize."""

import gguf
import numpy as np
import pyopencl as cl
import pytest
from test_quants import random_blocks

from gpu.device import select_device
from gpu.model.load import WeightTensor
from gpu.weights import upload_matrix
from kernels import source

Q = gguf.GGMLQuantizationType
TYPES = (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K)
SHAPE = ["-DEMBED_SCALE=1.0f", "-DQK_NORM=0", "-DACT_GELU=0", "-DNORM_EPS=1e-6f", "-DHEAD_DIM=16",
         "-DN_HEADS=1", "-DN_KV_HEADS=1", "-DN_LAYERS=1", "-DBLOCK_SIZE=16", "-DARGMAX_WG=16"]  # fmt: skip


@pytest.fixture(scope="module")
def program():
    device = select_device()
    return device, device.build(source("quant") + source("common"), SHAPE)


def device_rows(program, tensor: WeightTensor, compact: bool = False) -> tuple[str, np.ndarray]:
    device, prog = program
    m = upload_matrix(device.context, [tensor], compact)
    out = np.empty((tensor.rows, tensor.cols), np.float32)
    x = cl.Buffer(device.context, cl.mem_flags.WRITE_ONLY, out.nbytes)
    rows = cl.Buffer(device.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR,
                     hostbuf=np.arange(tensor.rows, dtype=np.int32))  # fmt: skip
    kernel = cl.Kernel(prog, f"embed_{m.kind}")
    kernel.set_args(m.qs, m.dm, rows, x, np.int32(tensor.cols))
    cl.enqueue_nd_range_kernel(device.queue, kernel, (tensor.cols // 32, tensor.rows), None)
    cl.enqueue_copy(device.queue, out, x)
    return m.kind, out


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_device_dequantize_matches_gguf(program, qtype) -> None:
    raw = random_blocks(qtype, 64).reshape(4, -1)  # 4 rows of 16 blocks
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    tensor = WeightTensor("w", qtype, 4, raw.shape[1] // gguf.GGML_QUANT_SIZES[qtype][1] * block, raw)
    _, got = device_rows(program, tensor)
    np.testing.assert_allclose(got, gguf.quants.dequantize(raw, qtype), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("qtype, at", [(Q.Q2_K, 82), (Q.Q3_K, 108)], ids=["Q2_K", "Q3_K"])
def test_low_bit_kinds_hold_subnormal_scales(program, qtype, at: int) -> None:
    """q2 and q3 carry the super-block scales widened to float32 by the host, so any f16
    scale, subnormal included, reads back exactly."""
    raw = random_blocks(qtype, 16).reshape(2, -1)
    raw[1, at : at + 2] = np.array([0x03FF], np.uint16).view(np.uint8)  # the largest subnormal
    tensor = WeightTensor("w", qtype, 2, 8 * 256, raw)
    kind, got = device_rows(program, tensor)
    assert kind == ("q2" if qtype == Q.Q2_K else "q3")
    np.testing.assert_allclose(got, gguf.quants.dequantize(raw, qtype), rtol=1e-6, atol=1e-9)


# (type, device kind, byte offsets of its f16 scales in a block: d, and Q4_K's dmin, rows, cols):
# Q5_0's 80 blocks are ten groups of 8, some straddling two rows
COMPACT = [(Q.Q4_K, "q4_k", (0, 2), 3, 512), (Q.Q6_K, "q6_k", (208,), 3, 512), (Q.Q5_0, "q5_0", (0,), 4, 640)]
# f16 bit patterns: the smallest and largest subnormal, a negative one, zero, -0.0, a negative normal, one
SPECIAL_SCALES = np.array([0x0001, 0x03FF, 0x8200, 0x0000, 0x8000, 0xB266, 0x3C00], np.uint16)


@pytest.mark.parametrize("qtype, kind, fields, rows, cols", COMPACT, ids=lambda c: getattr(c, "name", str(c)))
def test_compact_kinds_keep_the_file_bytes_and_read_any_f16_scale(program, qtype, kind: str, fields, rows: int, cols: int) -> None:
    """Q4_K, Q6_K and Q5_0 take no more bytes on the device than in the file, their f16
    scales read as bits by the kernels: subnormal, negative and zero ones read back
    exactly."""
    raw = random_blocks(qtype, rows * cols // gguf.GGML_QUANT_SIZES[qtype][0], seed=7).reshape(rows, -1)
    blocks = raw.reshape(-1, gguf.GGML_QUANT_SIZES[qtype][1])  # a view: writes reach raw
    for b in range(0, len(blocks), 2):  # every other block, its scales special
        for j, at in enumerate(fields):
            blocks[b, at : at + 2] = SPECIAL_SCALES[(b + j) % len(SPECIAL_SCALES) : (b + j) % len(SPECIAL_SCALES) + 1].view(np.uint8)
    tensor = WeightTensor("w", qtype, rows, cols, raw)
    device, _ = program
    m = upload_matrix(device.context, [tensor], compact=True)
    assert (m.kind, m.nbytes) == (kind, m.file_bytes)
    _, got = device_rows(program, tensor, compact=True)
    np.testing.assert_allclose(got, gguf.quants.dequantize(raw, qtype), rtol=1e-6, atol=1e-9)
