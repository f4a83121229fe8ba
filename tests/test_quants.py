"""The NumPy dequantizers against the gguf package's own, on random blocks of every type."""

import gguf
import numpy as np
import pytest

from gpu.model.quants import BLOCK_DEQUANTIZERS, SUPPORTED_TYPES, dequantize

Q = gguf.GGMLQuantizationType

# byte offsets of each block's f16 scales (random bytes there could be inf/NaN)
F16_FIELDS = {
    Q.Q4_0: (0,),
    Q.Q4_1: (0, 2),
    Q.Q5_0: (0,),
    Q.Q5_1: (0, 2),
    Q.Q8_0: (0,),
    Q.Q2_K: (80, 82),
    Q.Q3_K: (108,),
    Q.Q4_K: (0, 2),
    Q.Q5_K: (0, 2),
    Q.Q6_K: (208,),
}


def random_blocks(qtype: Q, n: int, seed: int = 0) -> np.ndarray:
    """n random blocks of `qtype` as raw bytes, with finite f16 scales."""
    rng = np.random.default_rng(seed)
    block_bytes = gguf.GGML_QUANT_SIZES[qtype][1]
    raw = rng.integers(0, 256, size=(n, block_bytes), dtype=np.uint8)
    for at in F16_FIELDS.get(qtype, ()):
        raw[:, at : at + 2] = rng.normal(0, 0.05, size=(n, 1)).astype(np.float16).view(np.uint8)
    if qtype == Q.BF16:
        raw = rng.normal(0, 1, size=(n, 1)).astype(np.float32).view(np.uint16)[:, 1:].view(np.uint8)
    return raw


@pytest.mark.parametrize("qtype", sorted(BLOCK_DEQUANTIZERS, key=lambda q: q.name), ids=lambda q: q.name)
def test_dequantize_matches_gguf(qtype):
    raw = random_blocks(qtype, 64).reshape(4, -1)  # 4 rows of 16 blocks
    ours = dequantize(raw, qtype)
    theirs = gguf.quants.dequantize(raw, qtype)
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)


def test_every_advertised_type_is_readable():
    assert {Q.Q4_0, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.BF16, Q.F16, Q.F32} <= SUPPORTED_TYPES


def test_dense_types_pass_through():
    x = np.linspace(-2, 2, 64, dtype=np.float32).reshape(2, 32)
    np.testing.assert_array_equal(dequantize(x, Q.F32), x)
    np.testing.assert_array_equal(dequantize(x.astype(np.float16), Q.F16), x.astype(np.float16).astype(np.float32))
