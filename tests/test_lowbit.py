"""The CPU family's integer Q2_K/Q3_K matmuls (kernels/cpu/lowbit.cl) against NumPy: gguf's
dequantized weights times the RMS-normalized inputs, for one column and for a batch wide
enough for the 8-column tile, with every pmaddwd width the device can build (AVX-512,
AVX2 and the portable expression)."""

import gguf
import numpy as np
import pyopencl as cl
import pytest
from test_device_quants import SHAPE
from test_quants import random_blocks

from gpu.device import select_device
from gpu.families import CPUFamily, host_has_vnni
from gpu.launches import CPUMatmul
from gpu.model.load import WeightTensor
from gpu.weights import upload_matrix
from kernels import source

Q = gguf.GGMLQuantizationType
ROWS, COLS, EPS = 67, 512, 1e-6  # an odd row count: the last work-item's pair is one row
WIDTHS = {512: "__AVX512BW__", 256: "__AVX2__", 0: None}
MAX_COLS = 40  # room for two of the nibble kinds' 32-column tiles


@pytest.fixture(scope="module")
def device():
    return select_device()


# the integer matmuls' sources, not attention's or argmax's (test_nibbles builds the same:
# one cold build serves both)
INTEGER_SOURCES = ("quant", "common", "cpu/matmul", "cpu/lowbit", "cpu/nibbles")


def build(device, width: int, vnni: bool = False, int8: bool = False) -> cl.Program:
    """The CPU family's integer matmuls at a pmaddwd width; with `vnni`, its multiply-adds as
    vpdpwssd (and vpdpbusd): AVX-512 VNNI's at 512 bits, AVX-VNNI's at 256; with `int8`,
    compact Q4_K and Q6_K, and Q4_0 and Q4_1, on 8-bit inputs (INT8_INPUTS, INT8_NIBBLES)."""
    macro = WIDTHS[width]
    if vnni and not (device.is_cpu and width in (512, 256) and host_has_vnni(width)):
        pytest.skip(f"no VNNI here at {width} bits (AVX-512 VNNI at 512, AVX-VNNI at 256)" if width else "the portable build has no VNNI")
    if macro and not device.is_cpu:
        pytest.skip("x86 pmaddwd widths are for CPU devices")
    if macro:
        try:
            device.build(f"#ifndef {macro}\n#error no {macro}\n#endif\n__kernel void probe() {{}}")
        except Exception:
            pytest.skip(f"this device's compiler does not target {macro}")
    family = CPUFamily(device)
    options = [f"-DWG={family.wg}", f"-DLOWBIT_WG={family.LOWBIT_WG}", f"-DMAX_COLS={MAX_COLS}", f"-DMADD_WIDTH={width}",
               f"-DDOT_VNNI={int(vnni and width == 512)}", f"-DAVX_VNNI={int(vnni and width == 256)}",
               *(["-DINT8_INPUTS=1", "-DINT8_NIBBLES=1"] if int8 else [])]  # fmt: skip
    return device.build("\n".join(map(source, INTEGER_SOURCES)), SHAPE + options)


@pytest.mark.parametrize("vnni", [False, True], ids=["madd", "vnni"])
@pytest.mark.parametrize("width", sorted(WIDTHS))
@pytest.mark.parametrize("qtype", [Q.Q2_K, Q.Q3_K], ids=lambda q: q.name)
@pytest.mark.parametrize("ncols", [1, 5])
def test_lowbit_matmul_matches_numpy(device, qtype, width: int, ncols: int, vnni: bool) -> None:
    program = build(device, width, vnni)
    raw = random_blocks(qtype, ROWS * COLS // 256, seed=width + ncols).reshape(ROWS, -1)
    tensor = WeightTensor("w", qtype, ROWS, COLS, raw)
    rng = np.random.default_rng(ncols)
    x = (rng.standard_normal((ncols, COLS)) * rng.uniform(0.1, 10, (ncols, 1))).astype(np.float32)
    g = (1 + 0.2 * rng.standard_normal(COLS)).astype(np.float32)
    ctx, flags = device.context, cl.mem_flags
    buffer = lambda a: cl.Buffer(ctx, flags.READ_ONLY | flags.COPY_HOST_PTR, hostbuf=a)  # noqa: E731
    y = cl.Buffer(ctx, flags.WRITE_ONLY, ncols * ROWS * 4)
    w = upload_matrix(ctx, [tensor])
    assert w.kind == ("q2" if qtype == Q.Q2_K else "q3")
    head = (w.qs, w.dm, buffer(g), buffer(x), buffer(np.arange(ncols, dtype=np.int32)), np.float32(EPS), y)
    launch = CPUMatmul("t", program, "matmul", CPUFamily.LOWBIT_WG, w, head, (np.int32(1), np.int32(0)))
    launch.enqueue(device.queue, ncols)
    got = np.empty((ncols, ROWS), np.float32)
    cl.enqueue_copy(device.queue, got, y)
    normed = x * g / np.sqrt((x * x).mean(axis=1, keepdims=True) + EPS)
    want = normed @ gguf.quants.dequantize(raw, qtype).T
    # 16-bit inputs: each rounded by at most 1/65534 of its super-block's largest |x|
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * np.abs(want).max())
