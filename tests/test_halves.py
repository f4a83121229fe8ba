"""K/V go into the cache through common.cl's store_halves: F16C's conversion where the
compiler targets it, vstore_half elsewhere. Both must round as vstore_half does (to
nearest even, NumPy's float16 cast), over normals, ties, subnormals, overflow and
infinities, and put each value at its own index. They come out through load_halves16:
AVX-512's conversion where the compiler targets it, vload_half16 elsewhere, both exact
for every half."""

import numpy as np
import pyopencl as cl
import pytest
from test_device_quants import SHAPE

from gpu.device import select_device
from kernels import source

KERNEL = """
__kernel void halves(__global const float2 *x, __global half *out)
{
    const int i = get_global_id(0);
    store_halves(x[i], 2 * i + 1, 2 * i, out);  /* swapped: each value to its own index */
}
"""


def inputs() -> np.ndarray:
    rng = np.random.default_rng(0)
    wide = rng.standard_normal(4096).astype(np.float32) * np.exp2(rng.uniform(-30, 20, 4096)).astype(np.float32)
    halves = rng.standard_normal(1024).astype(np.float16)
    ulp = np.spacing(np.abs(halves)).astype(np.float32)
    ties = halves.astype(np.float32) + ulp / 2  # exactly between two halves
    special = np.array([0.0, -0.0, 65504.0, 65519.0, 65520.0, 1e6, -1e6, np.inf, -np.inf, 6e-8, 2.9e-8, 3e-8, 1e-9,
                        6.1e-5, 6.09e-5, -6.1e-5], np.float32)  # fmt: skip
    return np.concatenate([wide, ties, -ties, special])


PROBE = """
__kernel void probe(__global int *out)
{
#if defined(MACRO)
    out[0] = 1;
#else
    out[0] = 0;
#endif
}
"""


def compiler_defines(device, macro: str) -> bool:
    """Whether the device's compiler targets what `macro` says (__F16C__, __AVX512F__: x86
    CPUs): a GPU's knows no x86 builtin."""
    out = cl.Buffer(device.context, cl.mem_flags.WRITE_ONLY, 4)
    device.build(PROBE.replace("MACRO", macro)).probe(device.queue, (1,), None, out)
    got = np.zeros(1, np.int32)
    cl.enqueue_copy(device.queue, got, out)
    return bool(got[0])


def run(device, source_text: str, kernel: str, options: list[str], x: np.ndarray, out: np.ndarray, items: int) -> np.ndarray:
    """`kernel` of `source_text` (built after quant.cl and common.cl) over `items` work-items,
    from x into out."""
    program = device.build(source("quant") + source("common") + source_text, options)
    ctx, flags = device.context, cl.mem_flags
    xb = cl.Buffer(ctx, flags.READ_ONLY | flags.COPY_HOST_PTR, hostbuf=x)
    ob = cl.Buffer(ctx, flags.WRITE_ONLY, out.nbytes)
    getattr(program, kernel)(device.queue, (items,), None, xb, ob)
    cl.enqueue_copy(device.queue, out, ob)
    return out


@pytest.mark.parametrize("f16c", [True, False], ids=["f16c", "vstore_half"])
def test_store_halves_rounds_as_vstore_half(f16c: bool) -> None:
    device = select_device()
    if f16c and not compiler_defines(device, "__F16C__"):
        pytest.skip(f"{device.name}: its compiler has no F16C")
    x = inputs()
    got = run(device, KERNEL, "halves", SHAPE + [f"-DF16C_STORES={int(f16c)}"], x, np.empty(len(x), np.uint16), len(x) // 2)
    with np.errstate(over="ignore"):  # overflow to infinity is a case
        want = x.reshape(-1, 2)[:, ::-1].reshape(-1).astype(np.float16)
    np.testing.assert_array_equal(got, want.view(np.uint16))


LOAD_KERNEL = """
__kernel void floats(__global const half *h, __global float16 *out)
{
    const int i = get_global_id(0);
    out[i] = load_halves16(h + 16 * i);
}
"""


@pytest.mark.parametrize("wide", [True, False], ids=["avx512", "vload_half16"])
def test_load_halves16_reads_every_half_exactly(wide: bool) -> None:
    device = select_device()
    if wide and not compiler_defines(device, "__AVX512F__"):
        pytest.skip(f"{device.name}: its compiler has no AVX-512")
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)  # every bit pattern
    options = SHAPE + [f"-DWIDE_HALF_LOADS={int(wide)}"]
    got = run(device, LOAD_KERNEL, "floats", options, halves, np.empty(len(halves), np.float32), len(halves) // 16)
    want = halves.view(np.float16).astype(np.float32)
    nan = np.isnan(want)
    assert np.isnan(got[nan]).all()
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
