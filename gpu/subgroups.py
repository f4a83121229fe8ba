"""How the GPU family's decode matmul adds up a row's lanes: across a subgroup,
or through local memory.

A unit's lanes (kernels/gpu/matmul.cl, mv) each hold a partial sum of the row,
and reduce.cl fixes the order they meet in: a pairwise tree. Where the device
can shuffle within a subgroup, the tree is an xor butterfly in registers, with no
local memory and no barrier; elsewhere one work-item per column walks the same
tree in local memory. Both give the same bits (a + b == b + a exactly), so the
choice never changes a token.

Shuffles, not sub_group_reduce_add: a reduce's order is the driver's, so it
could differ in the last bits from the local tree and from the prefill matmul
(which adds the same lanes in the same tree on one work-item). And Khronos'
cl_khr_subgroup_shuffle only, which Intel's, AMD's and other current drivers
report: Intel's own cl_intel_subgroups spelling could not be compiled here
(upstream clang does not declare it), and a path never compiled is not offered.
The shuffles are declared from OpenCL C 2.0, so the build asks for it.

    mode = choose(device.extensions, device.opencl_c_version)  # "khr" or "local"
    options = build_options(mode, device.opencl_c_version)
    lanes = lane_cap(mode, mv_kernels, device, wg)  # None: build again with "local"

"emulated" runs the butterfly through local memory (tests: the subgroup path's
order and lane indexing on a device without subgroups, such as PoCL's CPU).
"""

from __future__ import annotations

import re

import pyopencl as cl

from runtime.errors import ConfigError

MODES = ("auto", "khr", "local", "emulated")
DEFINES = {"local": 0, "khr": 1, "emulated": 2}
MAX_LANES = 32  # reduce.cl's TREE_LEVELS holds a tree of up to 32 lanes


def c_version(opencl_c_version: str) -> tuple[int, int]:
    """(major, minor) of a device's "OpenCL C 3.0 ..." string; (1, 0) if unreadable."""
    found = re.search(r"OpenCL C (\d+)\.(\d+)", opencl_c_version)
    return (int(found.group(1)), int(found.group(2))) if found else (1, 0)


def choose(extensions: str, opencl_c_version: str, requested: str = "auto") -> str:
    """The lane sums for a device: `requested` unless "auto"; else shuffles where the
    device has them and an OpenCL C that declares them (2.0 and up)."""
    if requested not in MODES:
        raise ConfigError(f"subgroups must be one of {', '.join(MODES)}, got {requested!r}")
    if requested != "auto":
        return requested
    if "cl_khr_subgroup_shuffle" in extensions.split() and c_version(opencl_c_version) >= (2, 0):
        return "khr"
    return "local"


def build_options(mode: str, opencl_c_version: str) -> list[str]:
    options = [f"-DSUBGROUPS={DEFINES[mode]}"]
    if mode == "khr":
        options.append("-cl-std=CL3.0" if c_version(opencl_c_version) >= (3, 0) else "-cl-std=CL2.0")
    return options


def lane_cap(mode: str, kernels: list[cl.Kernel], device: cl.Device, wg: int) -> int | None:
    """The most lanes a unit may have: MAX_LANES through local memory; with
    subgroups, the smallest subgroup the kernels run work-groups of `wg` in (a
    unit's lanes must share one), or None where the device will not say."""
    if mode != "khr":
        return MAX_LANES
    info = cl.kernel_sub_group_info.MAX_SUB_GROUP_SIZE_FOR_NDRANGE
    try:
        size = min(int(k.get_sub_group_info(info, device, (wg,))) for k in kernels)
    except (cl.Error, AttributeError, TypeError, ValueError):
        return None
    return power_of_two_floor(min(size, MAX_LANES)) if size >= 2 else None


def power_of_two_floor(n: int) -> int:
    return 1 << (n.bit_length() - 1)
