"""The CPU family's integer 32-weight-block matmuls (kernels/cpu/nibbles.cl: q4_1, q5, q6, q8_0)
against NumPy: gguf's dequantized weights times the RMS-normalized inputs, with every pmaddwd
width the device can build (and vpdpwssd where the CPU has AVX-512 VNNI), at one, two and
five columns (the 8-column tile) and twenty (the 32-column GEMM tile: two full sub-tiles, a
partial one and one skipped), for rows of whole groups of four blocks, rows with blocks past
the last whole group (a short group of their own), and rows shorter than a group; and a column's results
are the same bits at every tile width, and with vpdpwssd or without. With INT8_INPUTS (the
host's SLOTSWARM_INT8), compact Q4_K and Q6_K on 8-bit inputs, and with INT8_NIBBLES (its
=all) Q4_0 and Q4_1, match the reference's rounding of them (reference.Int8Matrix) to float
error, with the same invariances."""

import gguf
import numpy as np
import pyopencl as cl
import pytest
from reference import Int8Matrix
from test_device_quants import SHAPE
from test_lowbit import EPS, MAX_COLS, WIDTHS, build, device  # noqa: F401 (device is a fixture)
from test_quants import random_blocks

from gpu.families import CPUFamily
from gpu.launches import GEMM_TILE, LOWBIT_KINDS, NIBBLE_VARIANTS, STAGED_MIN, CPUMatmul, Stage, column_groups, cpu_variant, local_bytes
from gpu.model.load import WeightTensor
from gpu.weights import READ_PAST, upload_matrix
from swarm.bench.engine import CEILING_SUMS, multiply_ceiling

Q = gguf.GGMLQuantizationType
ROWS = 67  # odd: the last work-item's pair is one row


# (type, row length, normalized, compact): 576 is SmolLM2's d_model, four groups and two blocks
# (the compact kinds, SLOTSWARM_COMPACT: Q4_K, Q6_K, and Q5_0 in rows of whole groups of four
# blocks, 640 an odd number of halves a row, so groups of 8 blocks straddle rows, and the last is padded)
CASES = [(Q.Q4_1, 576, 1, 0), (Q.Q4_1, 576, 0, 0), (Q.Q4_0, 256, 1, 0), (Q.Q4_0, 96, 1, 0), (Q.Q4_K, 256, 0, 0),
         (Q.Q4_K, 512, 1, 1), (Q.Q4_K, 256, 0, 1), (Q.Q5_0, 576, 1, 0), (Q.Q5_0, 96, 0, 0), (Q.Q5_0, 640, 1, 1),
         (Q.Q5_0, 512, 0, 1), (Q.Q5_1, 576, 0, 0), (Q.Q5_K, 512, 1, 0), (Q.Q6_K, 512, 1, 0), (Q.Q6_K, 256, 0, 0),
         (Q.Q6_K, 512, 1, 1), (Q.Q6_K, 256, 0, 1), (Q.Q8_0, 576, 1, 0), (Q.Q8_0, 256, 0, 0)]  # fmt: skip
COMPACT_TYPES = [(Q.Q4_K, 1), (Q.Q5_0, 1), (Q.Q6_K, 1)]
K_QUANTS = (Q.Q4_K, Q.Q5_K, Q.Q6_K)
INT8_32 = (Q.Q4_0, Q.Q4_1)  # the 32-weight types INT8_NIBBLES takes on 8-bit inputs


def run(dev, program, raw, qtype, x: np.ndarray, g: np.ndarray, normalize: int, wg: int = CPUFamily.WG,
        compact: bool = False, staged: bool = True, gemm: bool = True, int8: bool = False, cores: int = 2) -> np.ndarray:  # fmt: skip
    """The matmul kernel on x's columns: (columns, ROWS), with its inputs staged from
    STAGED_MIN columns on, as the engine's are, or with `staged` False never; `int8`: the
    program takes Q4_K and Q6_K on 8-bit inputs (its local buffer is sized for them).
    ROWS make one work-group of rows, so on two `cores` a second 32-column tile is
    another work-group's (column_groups)."""
    ncols, cols = x.shape
    ctx, flags = dev.context, cl.mem_flags
    buffer = lambda a: cl.Buffer(ctx, flags.READ_ONLY | flags.COPY_HOST_PTR, hostbuf=a)  # noqa: E731
    y = cl.Buffer(ctx, flags.WRITE_ONLY, ncols * ROWS * 4)
    w = upload_matrix(ctx, [WeightTensor("w", qtype, ROWS, cols, raw)], compact)
    assert w.kind in LOWBIT_KINDS or cpu_variant(w.kind) == NIBBLE_VARIANTS[w.kind]
    head = (w.qs, w.dm, buffer(g), buffer(x), buffer(np.arange(ncols, dtype=np.int32)), np.float32(EPS), y)
    stage = Stage(ctx, cols, MAX_COLS) if staged else None
    launch = CPUMatmul("t", program, "matmul", wg, w, head, (np.int32(normalize), np.int32(0)),
                       local_mem=int(dev.device.local_mem_size) - 4 * MAX_COLS, gemm=gemm, stage=stage, int8=int8,
                       cores=cores)  # fmt: skip
    assert launch.gemm_tile == (32 if gemm and w.kind not in LOWBIT_KINDS else 8)
    assert launch.column_groups == column_groups(1, cores)
    for step in [launch.stage_inputs, launch] if launch.stage_inputs else [launch]:
        step.enqueue(dev.queue, ncols)
    got = np.empty((ncols, ROWS), np.float32)
    cl.enqueue_copy(dev.queue, got, y)
    return got


@pytest.mark.parametrize("vnni", [False, True], ids=["madd", "vnni"])
@pytest.mark.parametrize("width", sorted(WIDTHS))
@pytest.mark.parametrize(("qtype", "cols", "normalize", "compact"), CASES, ids=lambda c: getattr(c, "name", str(c)))
@pytest.mark.parametrize("ncols", [1, 2, 5, 20])
def test_nibble_matmul_matches_numpy(device, qtype, width: int, cols: int, ncols: int, normalize: int, compact: int, vnni: bool) -> None:  # noqa: F811
    program = build(device, width, vnni)
    per_block = 256 if qtype in K_QUANTS else 32
    raw = random_blocks(qtype, ROWS * cols // per_block, seed=width + ncols + cols).reshape(ROWS, -1)
    rng = np.random.default_rng(ncols + cols)
    x = (rng.standard_normal((ncols, cols)) * rng.uniform(0.1, 10, (ncols, 1))).astype(np.float32)
    x[:, :32] *= 30  # one block far larger than the rest of its group: the scale is the group's
    g = (1 + 0.2 * rng.standard_normal(cols)).astype(np.float32)
    got = run(device, program, raw, qtype, x, g, normalize, compact=bool(compact))
    inputs = x * g / np.sqrt((x * x).mean(axis=1, keepdims=True) + EPS) if normalize else x
    weights = gguf.quants.dequantize(raw, qtype)
    want = inputs @ weights.T
    # 16-bit inputs: each rounded by at most 1/65534 of its group's largest |x| (groups of 128
    # inputs, the last maybe short; compact Q4_K's and Q6_K's of 256, a super-block's)
    group = 256 if compact and qtype in K_QUANTS else 128
    padded = np.pad(np.abs(inputs), ((0, 0), (0, -cols % group)))
    grouped = padded.reshape(ncols, -1, group).max(axis=2, keepdims=True)
    step = np.broadcast_to(grouped / 65534, padded.reshape(ncols, -1, group).shape).reshape(ncols, -1)[:, :cols]
    bound = step @ np.abs(weights).T
    assert np.all(np.abs(got - want) <= np.maximum(1.01 * bound, 2e-4 * np.abs(want).max()))


@pytest.mark.parametrize("vnni", [False, True], ids=["madd", "vnni"])
@pytest.mark.parametrize("width", sorted(WIDTHS))
@pytest.mark.parametrize(("qtype", "cols", "normalize"), [(Q.Q4_K, 512, 1), (Q.Q4_K, 256, 0), (Q.Q6_K, 512, 1), (Q.Q6_K, 256, 0),
                                                          (Q.Q4_1, 576, 1), (Q.Q4_1, 256, 0), (Q.Q4_0, 576, 0)],
                         ids=lambda c: getattr(c, "name", str(c)))  # fmt: skip
@pytest.mark.parametrize("ncols", [1, 5, 20])
def test_int8_matmul_matches_the_rounding_reference(device, qtype, width: int, cols: int, normalize: int, ncols: int, vnni: bool) -> None:  # noqa: F811
    """INT8_INPUTS: each block of 32 inputs rounded to 8 bits, at most half a step off, and
    exactly as reference.Int8Matrix rounds them. Q4_K's and Q6_K's step is at most 1/127 of
    its super-block's largest |x| and at most 1/127 of the block's own plus 1/1016 of the
    super-block's; Q4_0's and Q4_1's 1/127 of the block's own (a row of 576, a short last group)."""
    program = build(device, width, vnni, int8=True)
    per_block = 256 if qtype in K_QUANTS else 32
    raw = random_blocks(qtype, ROWS * cols // per_block, seed=width + ncols + cols).reshape(ROWS, -1)
    rng = np.random.default_rng(ncols + cols)
    x = (rng.standard_normal((ncols, cols)) * rng.uniform(0.1, 10, (ncols, 1))).astype(np.float32)
    x[:, :32] *= 30  # one block far larger than the rest of its super-block
    g = (1 + 0.2 * rng.standard_normal(cols)).astype(np.float32)
    got = run(device, program, raw, qtype, x, g, normalize, compact=True, int8=True)
    inputs = x * g / np.sqrt((x * x).mean(axis=1, keepdims=True) + EPS) if normalize else x
    weights = gguf.quants.dequantize(raw, qtype)
    want = inputs @ weights.T
    if qtype in K_QUANTS:
        block_max = np.abs(inputs).reshape(ncols, -1, 8, 32).max(axis=3, keepdims=True)
        amax = block_max.max(axis=2, keepdims=True)
        half_step = (np.minimum(amax / 127, block_max / 127 + amax / 1016) / 2 * np.ones((1, 1, 1, 32))).reshape(ncols, cols)
    else:
        half_step = (np.abs(inputs).reshape(ncols, -1, 32).max(axis=2, keepdims=True) / 254 * np.ones((1, 1, 32))).reshape(ncols, cols)
    assert np.all(np.abs(got - want) <= 1.01 * half_step @ np.abs(weights).T + 2e-4 * np.abs(want).max())
    rounded = Int8Matrix(WeightTensor("w", qtype, ROWS, cols, raw.reshape(-1))).times(inputs)
    assert np.abs(got - rounded).max() <= 1e-5 * np.abs(rounded).max()


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K], ids=lambda q: q.name)
def test_a_long_row_s_prompt_takes_the_32_column_tile_on_8_bit_inputs(device, qtype) -> None:  # noqa: F811
    """Rows of 8,960 (Qwen2.5-Coder-1.5B's down matrix): 32 columns' SuperRecords (384 bytes
    a super-block) fit a CPU's local memory where its 16-bit groups (648) do not, so a prompt
    reads them 32 columns at a time, and still as the rounding reference does."""
    cols = 8960
    raw = random_blocks(qtype, ROWS * cols // 256, seed=9).reshape(ROWS, -1)
    w = WeightTensor("w", qtype, ROWS, cols, raw.reshape(-1))
    room = int(device.device.local_mem_size) - 4 * MAX_COLS
    if local_bytes(upload_matrix(device.context, [w], True), GEMM_TILE, int8=True) > room:
        pytest.skip("this device's local memory holds no 32-column tile of rows of 8,960")
    rng = np.random.default_rng(9)
    x = rng.standard_normal((20, cols)).astype(np.float32)
    g = (1 + 0.2 * rng.standard_normal(cols)).astype(np.float32)
    got = run(device, family_build(device, 1), raw, qtype, x, g, 1, compact=True, int8=True)  # (asserts the 32-column tile)
    rounded = Int8Matrix(w).times(x * g / np.sqrt((x * x).mean(axis=1, keepdims=True) + EPS))
    assert np.abs(got - rounded).max() <= 1e-5 * np.abs(rounded).max()


def family_build(dev, int8: int) -> cl.Program:
    """The build the device's own family takes, with INT8_INPUTS and INT8_NIBBLES as asked."""
    family = CPUFamily(dev)
    options = [f"-DWG={family.wg}", f"-DLOWBIT_WG={family.LOWBIT_WG}", f"-DMAX_COLS={MAX_COLS}",
               f"-DINT8_INPUTS={int8}", f"-DINT8_NIBBLES={int8}"]  # fmt: skip
    return dev.build(family.source(), SHAPE + options)


def batch_case(dev, qtype, int8: int, seed: int) -> tuple:
    """family_build's program, a ROWS-row matrix of `qtype` and MAX_COLS input columns with
    their norm weights: (program, raw, x, g). Rows of 32-weight blocks have blocks past the
    last group, or (compact Q5_0) a last half-group."""
    program = family_build(dev, int8)
    cols = 512 if qtype in K_QUANTS else 640 if qtype == Q.Q5_0 else 576
    raw = random_blocks(qtype, ROWS * cols // (256 if qtype in K_QUANTS else 32), seed=seed).reshape(ROWS, -1)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((MAX_COLS, cols)).astype(np.float32)
    g = (1 + 0.2 * rng.standard_normal(cols)).astype(np.float32)
    return program, raw, x, g


@pytest.mark.parametrize(("qtype", "compact"), [(q, 0) for q in (Q.Q4_1, Q.Q4_K, Q.Q5_0, Q.Q5_1, Q.Q5_K, Q.Q6_K, Q.Q8_0)] + COMPACT_TYPES,
                         ids=lambda c: getattr(c, "name", str(c)))  # fmt: skip
@pytest.mark.parametrize("int8", [0, 1], ids=["", "int8"])
def test_a_nibble_column_is_the_same_bits_at_every_tile_width(device, qtype, compact: int, int8: int) -> None:  # noqa: F811
    """What a batch-mate changes is only which tile a column is read in: a paused and
    resumed turn's logits must not move."""
    if int8 and not (compact and qtype in K_QUANTS or qtype in INT8_32):
        pytest.skip("INT8_INPUTS changes only compact Q4_K and Q6_K, INT8_NIBBLES Q4_0 and Q4_1")
    program, raw, x, g = batch_case(device, qtype, int8, seed=3)
    alone = run(device, program, raw, qtype, x[:1], g, 1, compact=bool(compact), int8=bool(int8))
    for ncols in (2, 3, 8, 20, MAX_COLS):  # tiles of 2, 4, 8 and 32 (one, and two: its column 33 the second's first)
        batch = run(device, program, raw, qtype, x[:ncols], g, 1, compact=bool(compact), int8=bool(int8))
        assert batch[0].tobytes() == alone[0].tobytes()
        for c in {ncols - 1, min(ncols - 1, 32)}:  # a later tile's, or sub-tile's, column read alone
            single = run(device, program, raw, qtype, x[c : c + 1], g, 1, compact=bool(compact), int8=bool(int8))
            assert batch[c].tobytes() == single[0].tobytes()


def test_a_few_row_groups_share_their_columns_among_the_cores() -> None:
    """A wide launch's work-groups keep every core busy: a part of one group of rows (the
    1.5B's V) takes a work-group a core, seven (its Q and K) or 35 (its swiglu) take two
    each, while a launch whose row groups share evenly reads its weights once."""
    assert [column_groups(g, 2) for g in (1, 2, 3, 6, 7, 35)] == [2, 1, 2, 1, 2, 2]
    assert column_groups(1, 16) == 4  # (at most four: each reads the rows' weights again)
    assert column_groups(8, 16) == 2


@pytest.mark.parametrize(("qtype", "compact"), [(q, 0) for q in (Q.Q4_1, Q.Q5_1, Q.Q6_K, Q.Q8_0)] + COMPACT_TYPES,
                         ids=lambda c: getattr(c, "name", str(c)))  # fmt: skip
@pytest.mark.parametrize("int8", [0, 1], ids=["", "int8"])
@pytest.mark.parametrize("gemm", [False, True], ids=["t8", "t32"])
def test_staged_inputs_give_the_bits_of_each_work_group_s_own(device, qtype, compact: int, int8: int, gemm: bool) -> None:  # noqa: F811
    """A wide batch's inputs quantized once by the stage kernels, and copied by every
    work-group of the matmul, are the bytes each work-group would make itself, and so
    are their RMS scales (ROWS is odd, so the last group's pair is one row; 9 columns,
    the fewest staged, leave a tile with one column live)."""
    if int8 and not (compact and qtype in K_QUANTS or qtype in INT8_32):
        pytest.skip("INT8_INPUTS changes only compact Q4_K and Q6_K, INT8_NIBBLES Q4_0 and Q4_1")
    program, raw, x, g = batch_case(device, qtype, int8, seed=7)
    assert STAGED_MIN == 9
    for ncols, normalize in ((STAGED_MIN, 1), (20, 0), (MAX_COLS, 1)):
        staged = run(device, program, raw, qtype, x[:ncols], g, normalize, compact=bool(compact), gemm=gemm, int8=bool(int8))
        own = run(device, program, raw, qtype, x[:ncols], g, normalize, compact=bool(compact), gemm=gemm, staged=False, int8=bool(int8))
        assert staged.tobytes() == own.tobytes()


def extreme_super_blocks(qtype, n: int, quant: int) -> np.ndarray:
    """n Q4_K or Q6_K super-blocks whose integer sums are the largest the kernels can meet:
    Q4_K every quant 15 and every scale and min 63; Q6_K every quant `quant` (0: q - 32 = -32,
    the largest in 16 bits; 63: the largest byte its 8-bit kernels multiply) and every scale
    -128; d 1 (and dmin 1)."""
    one = np.array([0x3C00], np.uint16).view(np.uint8)
    if qtype == Q.Q4_K:  # d, dmin, 12 bytes of 6-bit scales and mins, 128 of nibbles
        block = np.concatenate([one, one, np.full(12, 0xFF, np.uint8), np.full(128, 0xFF, np.uint8)])
    else:  # 128 low nibbles, 64 high bits, 16 int8 scales, d
        block = np.concatenate([np.full(192, 0xFF if quant else 0, np.uint8), np.full(16, 0x80, np.uint8), one])
    return np.tile(block, (n, 1))


@pytest.mark.parametrize("vnni", [False, True], ids=["madd", "vnni"])
@pytest.mark.parametrize("width", [512, 256])
@pytest.mark.parametrize("int8", [0, 1], ids=["", "int8"])
@pytest.mark.parametrize(("qtype", "quant"), [(Q.Q4_K, 15), (Q.Q6_K, 0), (Q.Q6_K, 63)], ids=lambda c: getattr(c, "name", str(c)))
def test_compact_super_block_sums_do_not_overflow(device, qtype, quant: int, int8: int, width: int, vnni: bool) -> None:  # noqa: F811
    """The compact Q4_K and Q6_K kernels add a super-block's scaled integer dot products in
    32 bits, and with INT8_INPUTS pack a block half's in 16, or on AVX2 add its byte products
    in 16 (cpu/nibbles.cl's bounds): at the largest quants, scales and inputs they still match
    NumPy, at one column and at a tile of eight."""
    program = build(device, width, vnni, bool(int8))
    cols = 512
    raw = extreme_super_blocks(qtype, ROWS * cols // 256, quant).reshape(ROWS, -1)
    want_row = gguf.quants.dequantize(raw[:1], qtype).sum()
    for ncols in (1, 8):
        x = np.ones((ncols, cols), np.float32)  # every input its group's largest: 32767 in 16 bits, 127 in 8
        got = run(device, program, raw, qtype, x, np.ones(cols, np.float32), 0, compact=True, int8=bool(int8))
        np.testing.assert_allclose(got, np.full((ncols, ROWS), want_row), rtol=1e-6)


@pytest.mark.parametrize("width", sorted(WIDTHS))
def test_q4_group_sums_do_not_overflow(device, width: int) -> None:  # noqa: F811
    """Q4_1 on 8-bit inputs (INT8_NIBBLES) adds a row's byte products in 16 bits on AVX2, eight
    a lane (cpu/nibbles.cl's group_lanes): with every quant 15 and every input its block's
    largest (127) they still match NumPy, at one column and at a tile of eight."""
    program = build(device, width, int8=True)
    one = np.array([0x3C00], np.uint16).view(np.uint8)
    raw = np.tile(np.concatenate([one, np.zeros(2, np.uint8), np.full(16, 0xFF, np.uint8)]), (ROWS * 576 // 32, 1))
    for ncols in (1, 8):
        got = run(device, program, raw, Q.Q4_1, np.ones((ncols, 576), np.float32), np.ones(576, np.float32), 0, int8=True)
        np.testing.assert_allclose(got, np.full((ncols, ROWS), 15.0 * 576), rtol=1e-6)


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q5_1, Q.Q8_0], ids=lambda q: q.name)
def test_rows_ending_in_a_short_group_have_zeros_after_the_last(device, qtype) -> None:  # noqa: F811
    """Rows of 576 inputs end in a short group of two blocks, which the kernels read as a
    whole one of four: after the last row they read READ_PAST zero bytes, not whatever
    follows the buffer. Rows of whole groups take none."""
    for cols, pad in ((576, READ_PAST), (512, 0)):
        raw = random_blocks(qtype, 3 * cols // 32, seed=2)
        w = upload_matrix(device.context, [WeightTensor("w", qtype, 3, cols, raw)])
        for buffer in (w.qs, w.dm):
            got = np.empty(buffer.size, np.uint8)
            cl.enqueue_copy(device.queue, got, buffer)
            assert not got[len(got) - pad :].any()
        assert w.qs.size + w.dm.size == w.nbytes + 2 * pad


LOWBIT_AND_NIBBLE = (Q.Q4_1, Q.Q4_K, Q.Q5_0, Q.Q5_K, Q.Q6_K, Q.Q8_0, Q.Q2_K, Q.Q3_K)


@pytest.mark.parametrize("width", [512, 256])
@pytest.mark.parametrize(("qtype", "compact", "int8"), [(q, 0, 0) for q in LOWBIT_AND_NIBBLE] + [(q, c, 0) for q, c in COMPACT_TYPES]
                         + [(Q.Q4_K, 1, 1), (Q.Q6_K, 1, 1), (Q.Q4_1, 0, 1)], ids=lambda c: getattr(c, "name", str(c)))  # fmt: skip
def test_vpdpwssd_gives_the_bits_of_pmaddwd(device, qtype, compact: int, int8: int, width: int) -> None:  # noqa: F811
    """The VNNI build is one instruction where the other takes two, in the same integers
    (and with INT8_INPUTS, vpdpbusd where the other takes pmaddubsw and pmaddwd, or on AVX2
    pmaddubsw's pairs added in 16 bits): a host with and one without VNNI sample the same
    tokens."""
    madd, vnni = build(device, width, int8=bool(int8)), build(device, width, vnni=True, int8=bool(int8))
    cols = 512 if qtype in K_QUANTS + (Q.Q2_K, Q.Q3_K) else 640 if compact else 576
    raw = random_blocks(qtype, ROWS * cols // (256 if cols == 512 else 32), seed=5).reshape(ROWS, -1)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((20, cols)).astype(np.float32)
    g = (1 + 0.2 * rng.standard_normal(cols)).astype(np.float32)
    for ncols in (1, 5, 20):
        wg = CPUFamily.LOWBIT_WG if qtype in (Q.Q2_K, Q.Q3_K) else CPUFamily.WG
        assert (run(device, vnni, raw, qtype, x[:ncols], g, 1, wg, bool(compact), int8=bool(int8)).tobytes()
                == run(device, madd, raw, qtype, x[:ncols], g, 1, wg, bool(compact), int8=bool(int8)).tobytes())  # fmt: skip


@pytest.mark.model
def test_a_prompt_gives_the_same_bits_through_the_32_column_tile(smollm2_model, monkeypatch) -> None:
    """SLOTSWARM_GEMM's tile in the whole forward pass (Q4_1, and the Q8_0 head): a
    40-token prompt's logits are the bits the 8-column tiles give."""
    from gpu.engine import OpenCLEngine
    from runtime.scheduling.work import Work

    prompt = Work(turn=0, tokens=list(range(100, 140)), start=0, block_table=list(range(4)), sample=True)
    logits = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("SLOTSWARM_GEMM", flag)
        engine = OpenCLEngine(smollm2_model, num_blocks=8, kernels="cpu")
        matmuls = [m for m in engine.launches.layers if isinstance(m, CPUMatmul)]
        assert {m.gemm_tile for m in matmuls} == {32 if flag == "1" else 8}
        logits[flag] = engine.step_logits([prompt])
    assert logits["1"].tobytes() == logits["0"].tobytes()


@pytest.mark.model
def test_a_decode_gives_the_same_bits_alone_and_among_batch_mates(smollm2_model) -> None:
    """SmolLM2's matmuls are all integer ones (Q4_1, the Q8_0 head), and the swiglu's
    activations are one 16-lane vector at every tile width: a turn's step alone (1-column
    tiles) and beside four mates (8-column tiles) gives the same bits."""
    from gpu.engine import OpenCLEngine
    from runtime.scheduling.work import Work

    engine = OpenCLEngine(smollm2_model, num_blocks=16, kernels="cpu")
    engine.step_logits([Work(turn=0, tokens=list(range(200, 212)), start=0, block_table=[0], sample=True)])
    turn = Work(turn=0, tokens=[300], start=12, block_table=[0], sample=True)
    alone = engine.step_logits([turn])[0]
    mates = [Work(turn=t, tokens=[400 + t], start=0, block_table=[t], sample=True) for t in range(1, 5)]
    among = engine.step_logits(mates[:2] + [turn] + mates[2:])[2]
    assert among.tobytes() == alone.tobytes()


@pytest.mark.parametrize("vnni", [False, True], ids=["madd", "vnni"])
@pytest.mark.parametrize("width", sorted(WIDTHS))
@pytest.mark.parametrize("bits", [8, 16])
def test_the_multiply_ceiling_takes_every_product(device, width: int, vnni: bool, bits: int) -> None:  # noqa: F811
    """cpu/nibbles.cl's multiply_ceiling, the rate `swarm bench engine` puts a prompt against:
    each work-item's sum over a few rounds is that of every product it is to take (weights
    (b + i) % 16 of accumulator i against inputs b % 32 + r, b a register's byte, r the round),
    so what it times is the multiplies themselves."""
    program = build(device, width, vnni, int8=True)
    rounds, cores = 3, 2
    rate, sums = multiply_ceiling(device, program, cores, bits, rounds=rounds)
    b = np.arange(64)
    weights = [(b + i) % 16 for i in range(CEILING_SUMS)]
    inputs = [b % 32 + r for r in range(rounds)]
    if bits == 16:  # each pair of bytes one 16-bit lane
        weights = [w[0::2] + 256 * w[1::2] for w in weights]
        inputs = [x[0::2] + 256 * x[1::2] for x in inputs]
    want = sum(int(w @ x) for w in weights for x in inputs) % 2**32
    assert sums.tolist() == [want] * len(sums) and len(sums) >= cores
    assert rate > 0


@pytest.mark.parametrize(("setting", "eight"), [("0", set()), ("1", {"q4_k", "q6_k"}), ("all", {"q4_k", "q6_k", "q4_1"})])
def test_the_family_says_which_kinds_take_8_bit_inputs(device, monkeypatch, setting: str, eight: set) -> None:  # noqa: F811
    """CPUFamily.input_bits, by which the bench prices a prompt's products, says what
    INT8_INPUTS and INT8_NIBBLES take (quantize_for in cpu/layer.cl, the *_BEGIN macros)."""
    monkeypatch.setenv("SLOTSWARM_INT8", setting)
    family = CPUFamily(device)
    kinds = [*NIBBLE_VARIANTS, *LOWBIT_KINDS]
    assert {kind for kind in kinds if family.input_bits(kind) == 8} == eight
    assert all(family.input_bits(kind) == 16 for kind in kinds if kind not in eight)
