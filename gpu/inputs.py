"""A step's inputs on the device: token ids, positions, turn indices, sampled rows,
the rows sampled at a temperature with their parameters (gpu.devicesampling), the
constrained rows (gpu.masks) and block tables, as regions of one buffer that one copy writes.

On PoCL every command costs tens of microseconds of the cores the kernels run on,
and a step used to write its inputs in five; the kernels bind the regions
(sub-buffers) once, at start-up, as they would separate buffers.
"""

from __future__ import annotations

import numpy as np
import pyopencl as cl

from runtime.scheduling.units import ceil_div

i32 = np.int32


class StepInputs:
    """Regions for a step of up to `t` tokens (and as many turns) of `max_blocks` block-table entries."""

    def __init__(self, device, t: int, max_blocks: int):
        sizes = {
            "tokens": t,
            "pos": t,
            "seq": t,
            "sample_rows": t,
            "hot_rows": t,
            "hot_params": 2 * t,
            "mask_rows": t,
            "tables": t * max_blocks,
        }  # tables last
        align = max(1, int(device.device.mem_base_addr_align) // 32)  # where a region may start, in words
        self.at, end = {}, 0
        for name, n in sizes.items():
            self.at[name] = end
            end += ceil_div(n, align) * align
        self.buffer = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, 4 * end)
        self.staging = np.zeros(end, i32)
        self.regions = {name: self.buffer.get_sub_region(4 * self.at[name], 4 * n) for name, n in sizes.items()}

    def write(self, queue: cl.CommandQueue, **arrays: np.ndarray) -> None:
        """Enqueue one copy of the arrays (int32, by region name) into their regions; the
        staging array is read until the queue gets that far, so the caller finishes the
        queue before the next write."""
        for name, arr in arrays.items():
            self.staging[self.at[name] : self.at[name] + arr.size] = arr.ravel()
        end = max(self.at[name] + arr.size for name, arr in arrays.items())
        cl.enqueue_copy(queue, self.buffer, self.staging[:end], is_blocking=False)
