"""Kernel launches bound to their buffers once, for the kernel families.

pyopencl's per-call argument setting cost more host time than the kernels took
at batch 1, so every launch of a step sets its arguments at start-up, and a step
sets only the batch width, and only where it changed: one `set_arg` costs about
8 us of Python, several times a launch's own 1 us (most steps repeat the last
step's width). Each launch has a `name` (what profiles group by) and
the weight bytes it reads per call (for GB/s in a profile).
"""

from __future__ import annotations

import re

import numpy as np
import pyopencl as cl

from gpu.weights import DeviceMatrix
from kernels import source
from runtime.scheduling.units import ceil_div

i32 = np.int32


class Grid:
    """A kernel over a (dim0, tokens) grid."""

    def __init__(self, name: str, program: cl.Program, kernel: str, dim0: int, local: tuple | None, *args, weight_bytes: int = 0):
        self.name, self.weight_bytes = name, weight_bytes
        self.kernel = cl.Kernel(program, kernel)
        self.kernel.set_args(*args)
        self.dim0, self.local = dim0, local

    def enqueue(self, queue: cl.CommandQueue, t: int) -> cl.Event:
        return cl.enqueue_nd_range_kernel(queue, self.kernel, (self.dim0, t), self.local)


GROUPED_MIN = 6  # query heads a KV head serves, at least, for attention by KV head


def attention_kernel(n_heads: int, n_kv_heads: int, tokens: int, min_items: int) -> str:
    """Which of kernels/cpu/attention.cl's kernels a step takes (the same bits either way):
    `attention_group`, a work-item per KV head and token, where each KV head serves at
    least GROUPED_MIN query heads (each K/V vector is widened once for them; smaller groups
    save less than its bookkeeping costs) and the step makes at least `min_items` work-items,
    else `attention`, a work-item per query head, so a batch-1 decode still spreads over
    the cores."""
    grouped = n_heads // n_kv_heads >= GROUPED_MIN and n_kv_heads * tokens >= min_items
    return "attention_group" if grouped else "attention"


class CPUAttention:
    """The CPU family's attention over a (heads, tokens) grid of 1x1 work-groups, by query
    head or by KV head as attention_kernel chooses for the step."""

    name, weight_bytes = "attention", 0

    def __init__(self, program: cl.Program, n_heads: int, n_kv_heads: int, min_items: int, *args):
        self.kernels = {}
        for kernel, heads in (("attention", n_heads), ("attention_group", n_kv_heads)):
            self.kernels[kernel] = (cl.Kernel(program, kernel), heads)
            self.kernels[kernel][0].set_args(*args)
        self.n_heads, self.n_kv_heads, self.min_items = n_heads, n_kv_heads, min_items

    def enqueue(self, queue: cl.CommandQueue, t: int) -> cl.Event:
        kernel, heads = self.kernels[attention_kernel(self.n_heads, self.n_kv_heads, t, self.min_items)]
        return cl.enqueue_nd_range_kernel(queue, kernel, (heads, t), (1, 1))


def _tile(ncols: int, widest: int = 8) -> int:
    """The CPU matmul variant: how many batch columns one weight read serves (`widest`
    the widest the launch has: cpu/nibbles.cl's GEMM tile for many columns)."""
    return 1 if ncols == 1 else 2 if ncols == 2 else 4 if ncols <= 4 else 8 if ncols <= 8 or widest == 8 else widest


LOWBIT_KINDS = ("q2", "q3")  # read by kernels/cpu/lowbit.cl


# read by kernels/cpu/nibbles.cl
NIBBLE_VARIANTS = {"q4_1": "nib", "q5": "nib5", "q6": "nib6", "q8_0": "nib8", "q4_k": "nibq4k", "q6_k": "nibq6k", "q5_0": "nibq50"}
SUPER_KINDS = frozenset({"q4_k", "q6_k"})  # read a super-block at a time (cpu/nibbles.cl's SUPER_KIND)


def cpu_variant(kind: str) -> str:
    """The CPU kernels' name for a weight kind at a tile width: cpu/nibbles.cl's for the
    kinds of 32-weight blocks it reads in integer arithmetic (4-, 5-, 6- and 8-bit)."""
    return NIBBLE_VARIANTS.get(kind, kind)


def lowbit_local(w: DeviceMatrix, tile: int, int8: bool = False) -> tuple:
    """The local buffer the integer kernels quantize a tile's inputs into. cpu/lowbit.cl:
    per column 2 bytes an input, an int16 of sums and a float scale per super-block of
    256; cpu/nibbles.cl: per column and group of 128 inputs, a float16 of sums, 256
    bytes of inputs and a float scale, or where the program takes Q4_K and Q6_K on 8-bit
    inputs (`int8`, cpu/nibbles.cl's INT8_INPUTS) their SuperRecords, a super-block each."""
    nbytes = local_bytes(w, tile, int8)
    return (cl.LocalMemory(nbytes),) if nbytes else ()


SUPER_RECORD_BYTES = 384  # cpu/nibbles.cl's SuperRecord: a column's 256 inputs in 8 bits, steps and sums


def local_bytes(w: DeviceMatrix, tile: int, int8: bool = False) -> int:
    """The size of lowbit_local's buffer (0: the kind takes none)."""
    if w.kind in LOWBIT_KINDS:
        return tile * (2 * w.cols + (64 + 4) * (w.cols // 256))
    if int8 and w.kind in SUPER_KINDS:
        return tile * (w.cols // 256) * SUPER_RECORD_BYTES
    if w.kind in NIBBLE_VARIANTS:
        return max(64, tile * ceil_div(w.cols, 128) * (64 + 256 + 4))
    return 0


GEMM_TILE = 32  # columns of cpu/nibbles.cl's widest tile (prefill and batches past 8, where on)
MAX_TILE = 8  # columns of cpu/matmul.cl's widest tile otherwise, and of a stage's work-group
STAGED_MIN = 9  # columns from which a nibble matmul's inputs are staged (below, the launches cost what they save)


def staged_bytes(k: int, cols: int) -> int:
    """The bytes of a nibble kind's inputs of length `k` staged for `cols` columns: a float
    a column (its RMS scale) up to a whole 64 bytes, then its local buffer's layout
    (local_bytes) as wide as the batch, in 16 bits (SuperRecords take less)."""
    return ceil_div(4 * cols, 64) * 64 + cols * ceil_div(k, 128) * (64 + 256 + 4)


class Stage:
    """Where a nibble matmul's inputs are staged (cpu/nibbles.cl's stage_* kernels): a
    buffer shared by every matmul of a step (they run one after another) and its width
    in columns, the batch's most rounded up to a work-group's tile."""

    def __init__(self, context: cl.Context, k: int, max_cols: int):
        self.cols = ceil_div(max_cols, MAX_TILE) * MAX_TILE
        self.buffer = cl.Buffer(context, cl.mem_flags.READ_WRITE, staged_bytes(k, self.cols))


class CPUStage:
    """A nibble matmul's inputs quantized once for all its work-groups, where the batch
    has at least STAGED_MIN columns (its enqueue is None below that): each of its
    work-groups quantizes a tile of MAX_TILE columns into the Stage's buffer."""

    NCOLS = 5  # index of the ncols argument

    def __init__(self, program: cl.Program, wg: int, w: DeviceMatrix, g, x, xrows, eps, normalize: int, stage: Stage,
                 int8: bool = False):  # fmt: skip
        self.name, self.weight_bytes, self.wg = "stage", 0, wg
        self.kernel = cl.Kernel(program, f"stage_{cpu_variant(w.kind)}")
        self.kernel.set_args(g, x, xrows, eps, i32(w.cols), i32(1), i32(normalize), stage.buffer, i32(stage.cols),
                             *lowbit_local(w, MAX_TILE, int8))  # fmt: skip
        self.width = 1  # the ncols argument as last set

    def enqueue(self, queue: cl.CommandQueue, ncols: int) -> cl.Event | None:
        if ncols < STAGED_MIN:
            return None
        if self.width != ncols:
            self.kernel.set_arg(self.NCOLS, i32(ncols))
            self.width = ncols
        return cl.enqueue_nd_range_kernel(queue, self.kernel, (ceil_div(ncols, MAX_TILE) * self.wg,), (self.wg,))


def column_groups(row_groups: int, cores: int, most: int = 4) -> int:
    """How many work-groups share each group of rows' column tiles in the 32-column kernels
    (cpu/nibbles.cl's TILE_STRIDE): the fewest, up to `most`, that leave the busiest core
    the least work. Each work-group past the first reads the rows' weights again."""

    def busiest(split: int) -> float:  # the busiest core's work, in row groups
        return ceil_div(row_groups * split, cores) / split

    return min(range(1, most + 1), key=lambda split: (busiest(split), split))


class CPUMatmul:
    """A CPU-family fused matmul (kernels/cpu/matmul.cl; kernel is matmul, swiglu or
    qkv) in every tile variant; a work-item owns a pair of rows, in the 32-column tile
    two (kernels/cpu/nibbles.cl's DEFINE_WIDE). With `gemm`, batches past 8 columns
    take the nibble kinds' 32-column tile where its local buffer fits the device
    (`gemm_tile`: the widest tile taken). A nibble kind's matmul given a `stage` has
    `stage_inputs`, the CPUStage to enqueue before it; from STAGED_MIN columns on it
    reads what that staged. `int8`: the program takes Q4_K and Q6_K on
    8-bit inputs (lowbit_local). `cores`: the device's; where its groups of rows do
    not share evenly among them, the 32-column tile's work-groups share the batch's
    tiles too (column_groups)."""

    NCOLS = 9  # index of the ncols argument

    def __init__(self, name: str, program: cl.Program, kernel: str, wg: int, w: DeviceMatrix, head: tuple, extra: tuple,
                 local_mem: int = 0, gemm: bool = False, stage: Stage | None = None, int8: bool = False,
                 cores: int = 1):  # fmt: skip
        self.name, self.weight_bytes, self.wg = name, w.nbytes, wg
        rows = w.rows // 2 if kernel == "swiglu" else w.rows

        def grid(per_item: int) -> tuple[tuple[int], tuple[int] | None]:
            """(global size, offset) where a work-item owns per_item rows: a part of a split
            stack (qkv only) starts its work-items at its first rows, and the kernel reads
            its own rows from there"""
            return (ceil_div(ceil_div(rows, per_item), wg) * wg,), ((w.first_row // per_item,) if w.first_row else None)

        self.grid, self.wide_grid = grid(2), grid(4)  # a row pair; two in the 32-column tile
        self.column_groups = column_groups(self.wide_grid[0][0] // wg, cores)
        rows += w.first_row
        nibbles = w.kind in NIBBLE_VARIANTS
        self.stage = stage  # (a kernel argument holds no reference to its buffer)
        self.stage_inputs, staging = None, ()
        if nibbles:
            # swiglu and qkv always normalize; matmul's first own argument says whether it does
            normalize = 1 if kernel != "matmul" else int(extra[0])
            if stage is not None:
                self.stage_inputs = CPUStage(program, wg, w, *head[2:6], normalize, stage, int8)
            staging = (stage.buffer if stage else head[0], i32(0))  # (the staged width: set by enqueue)
        self.staged_arg = 10 + len(extra) + 1  # index of the staged width, after the kernel's own arguments
        self.tiles = {}
        # (a part whose first row is not a multiple of four has no whole first item in that tile)
        wide = gemm and nibbles and local_bytes(w, GEMM_TILE, int8) <= local_mem and w.first_row % 4 == 0
        for tile in (1, 2, 4, 8) + ((GEMM_TILE,) if wide else ()):
            k = cl.Kernel(program, f"{kernel}_{cpu_variant(w.kind)}_t{tile}")
            k.set_args(*head, i32(rows), i32(w.cols), i32(1), *extra, *staging, *lowbit_local(w, tile, int8))
            self.tiles[tile] = k
        self.widths = dict.fromkeys(self.tiles, 1)  # each variant's ncols argument as last set
        self.staged_cols = stage.cols if stage is not None and nibbles else 0
        self.staged = dict.fromkeys(self.tiles, 0)  # each variant's staged width as last set
        self.gemm_tile = max(self.tiles)

    def enqueue(self, queue: cl.CommandQueue, ncols: int) -> cl.Event:
        tile = _tile(ncols, self.gemm_tile)
        kernel = self.tiles[tile]
        if self.widths[tile] != ncols:
            kernel.set_arg(self.NCOLS, i32(ncols))
            self.widths[tile] = ncols
        staged = self.staged_cols if ncols >= STAGED_MIN else 0
        if self.staged[tile] != staged:
            kernel.set_arg(self.staged_arg, i32(staged))
            self.staged[tile] = staged
        if tile != GEMM_TILE:
            size, offset = self.grid
            return cl.enqueue_nd_range_kernel(queue, kernel, size, (self.wg,), global_work_offset=offset)
        (items,), offset = self.wide_grid
        groups = min(self.column_groups, ceil_div(ncols, GEMM_TILE))
        return cl.enqueue_nd_range_kernel(queue, kernel, (items, groups), (self.wg, 1), global_work_offset=offset and (*offset, 0))


# kernels/quant.cl's WT_ codes by kind (WT_Q4_K is q4_k's), for the nibble kinds, which
# kernels/cpu/layer.cl reads
WTYPES = {m[1].lower(): int(m[2]) for m in re.finditer(r"#define WT_(\w+) (\d+)", source("quant"))}
LAYER_WTYPES = {kind: WTYPES[kind] for kind in NIBBLE_VARIANTS}
# ints a layer's phases count in (a cache line: kernels/cpu/layer.cl's LAYER_COUNTERS)
LAYER_COUNTERS = int(re.search(r"#define LAYER_COUNTERS (\d+)", source("cpu/layer"))[1])


class ZeroCounters:
    """Zeroes every layer's counters before a step's CPULayer launches."""

    name, weight_bytes = "counters", 0

    def __init__(self, context: cl.Context, layers: int):
        self.nbytes = 4 * LAYER_COUNTERS * layers
        self.buffer = cl.Buffer(context, cl.mem_flags.READ_WRITE, self.nbytes)

    def enqueue(self, queue: cl.CommandQueue, t: int) -> cl.Event:
        return cl.enqueue_fill_buffer(queue, self.buffer, i32(0), 0, self.nbytes)


class CPULayer:
    """A one-token step's layer in one launch (kernels/cpu/layer.cl's decode_layer): a
    work-group of one work-item for each of the device's `cores`, sharing each phase's
    row pairs by claiming runs of them. `matrices` are the layer's, for its weight bytes."""

    name = "layer"

    def __init__(self, program: cl.Program, cores: int, matrices: list[DeviceMatrix], *args):
        self.weight_bytes = sum(w.nbytes for w in matrices)
        self.kernel = cl.Kernel(program, "decode_layer")
        self.kernel.set_args(*args)
        self.cores = cores

    def enqueue(self, queue: cl.CommandQueue, t: int) -> cl.Event:
        return cl.enqueue_nd_range_kernel(queue, self.kernel, (self.cores,), (1,))


OP_MATMUL, OP_SWIGLU, OP_QKV = 0, 1, 2
MV_MAX_COLS = 16  # wider batches take the tiled kernel
MM_ROWS, MM_COLS = 32, 32


class GPUMatmul:
    """A GPU-family fused matmul (kernels/gpu/matmul.cl): `mv` for a few columns,
    `mm` (tiled through local memory) for many; both add in the same order, so
    which one a step takes never changes a row's result."""

    NCOLS = 9  # index of the ncols argument

    def __init__(self, name: str, program: cl.Program, op: int, wg: int, lanes: int, w: DeviceMatrix, args: tuple):
        self.name, self.weight_bytes, self.wg = name, w.nbytes, wg
        rows = w.rows // 2 if op == OP_SWIGLU else w.rows
        units = rows if op == OP_SWIGLU else ceil_div(rows, 2)
        blocks = w.cols // 32
        # lanes per unit: a power of two, at most a warp (or the subgroup: `lanes`),
        # no more than the row has blocks. It fixes the order a row's sum is
        # added in (reduce.cl), so it depends on the matrix and device only.
        self.lpu = min(1 << (blocks.bit_length() - 1), lanes, wg)
        self.mv_size = (ceil_div(units, wg // self.lpu) * wg,)
        self.mm_groups = ceil_div(units, MM_ROWS // 2)
        self.kernels = {}
        for shape in ("mv", "mm"):
            k = cl.Kernel(program, f"{shape}_{w.kind}")
            k.set_args(*args[:7], i32(rows), i32(w.cols), i32(1), i32(op), *args[7:], i32(self.lpu))
            self.kernels[shape] = k
        self.widths = dict.fromkeys(self.kernels, 1)  # each shape's ncols argument as last set

    def enqueue(self, queue: cl.CommandQueue, ncols: int) -> cl.Event:
        shape = "mv" if ncols <= MV_MAX_COLS else "mm"
        if shape == "mv":
            kernel, size, local = self.kernels["mv"], self.mv_size, (self.wg,)
        else:
            kernel, size, local = self.kernels["mm"], (self.mm_groups * self.wg, ceil_div(ncols, MM_COLS)), (self.wg, 1)
        if self.widths[shape] != ncols:
            kernel.set_arg(self.NCOLS, i32(ncols))
            self.widths[shape] = ncols
        return cl.enqueue_nd_range_kernel(queue, kernel, size, local)


class GPUAttention:
    """The GPU family's attention (kernels/gpu/attention.cl) over a (KV heads,
    tokens, splits) grid; `split_count()` gives the splits the step's longest token needs."""

    name, weight_bytes = "attention", 0

    def __init__(self, program: cl.Program, wg: int, kv_heads: int, args: tuple, split_count):
        self.kernel = cl.Kernel(program, "attention")
        self.kernel.set_args(*args)
        self.wg, self.kv_heads, self.split_count = wg, kv_heads, split_count

    def enqueue(self, queue: cl.CommandQueue, t: int) -> cl.Event:
        size = (self.kv_heads * self.wg, t, self.split_count())
        return cl.enqueue_nd_range_kernel(queue, self.kernel, size, (self.wg, 1, 1))


class ApplyMask:
    """Constrained rows' token masks onto their logits (common.cl's `apply_mask`,
    both families): `enqueue(queue, rows)` for the first `rows` of the step's
    constrained rows."""

    name, weight_bytes = "mask", 0
    WORDS = 16  # common.cl's MASK_WORDS: mask words per work-item

    def __init__(self, program: cl.Program, logits: cl.Buffer, vocab: int, rows: cl.Buffer, masks: cl.Buffer):
        self.kernel = cl.Kernel(program, "apply_mask")
        self.words = ceil_div(vocab, 32)
        self.kernel.set_args(logits, i32(vocab), rows, masks, i32(self.words))

    def enqueue(self, queue: cl.CommandQueue, rows: int) -> cl.Event:
        return cl.enqueue_nd_range_kernel(queue, self.kernel, (ceil_div(self.words, self.WORDS), rows), None)


class Argmax:
    """Greedy sampling on the device: one work-group per sampled row (common.cl's
    `argmax`, or the CPU family's `argmax_lanes` in work-groups of one)."""

    name, weight_bytes = "argmax", 0

    def __init__(self, program: cl.Program, wg: int, logits: cl.Buffer, vocab: int, ids: cl.Buffer, kernel: str = "argmax"):
        self.kernel = cl.Kernel(program, kernel)
        self.kernel.set_args(logits, i32(vocab), ids)
        self.wg = wg

    def enqueue(self, queue: cl.CommandQueue, rows: int) -> cl.Event:
        return cl.enqueue_nd_range_kernel(queue, self.kernel, (rows * self.wg,), (self.wg,))
