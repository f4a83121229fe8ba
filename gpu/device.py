"""Pick an OpenCL device and build programs for it.

Choice, first that applies: an explicit spec (argument, `--device` flag or the
session config), the `PYOPENCL_CTX` environment variable, else the first GPU of
any platform, else the first device at all (the CPU through PoCL). Without a spec,
a device whose compiler cannot build a one-line kernel is passed over: PoCL's
bundled LLVM names CPUs newer than itself "generic" and then refuses to compile
for "generic" (on AMD Zen 5, say), while a distribution's PoCL on the same
machine works. A spec is
"platform:device" where each part is an index or a case-insensitive substring
of the name; a spec without a colon matches a device on any platform.

Compiled programs are cached between runs by pyopencl's binary cache
(`PYOPENCL_CACHE_DIR`, default under the user cache dir).
"""

from __future__ import annotations

import hashlib
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import platformdirs
import pyopencl as cl

from runtime.errors import DeviceError

INSTALL_HINT = (
    'pip install "pyopencl[pocl]" gives a CPU device; where its compiler does not know the CPU, '
    "a distribution's PoCL does (Debian: apt-get install pocl-opencl-icd)"
)
_PROBE = "__kernel void probe(__global float *x) { x[get_global_id(0)] += 1.0f; }"


@dataclass
class Device:
    """A chosen OpenCL device with its context and in-order queue."""

    device: cl.Device
    context: cl.Context
    queue: cl.CommandQueue

    @property
    def name(self) -> str:
        return f"{self.device.platform.name.strip()}: {self.device.name.strip()}"

    @property
    def is_cpu(self) -> bool:
        return bool(self.device.type & cl.device_type.CPU)

    @property
    def global_mem(self) -> int:
        return int(self.device.global_mem_size)

    def build(self, source: str, options: list[str] | None = None, on_compile: Callable[[], None] | None = None) -> cl.Program:
        """Compile `source`; a failure raises DeviceError carrying the build log.
        `on_compile` is called first when this machine has not built this program
        for this device before (see BUILT_DIR): the build compiles from scratch."""
        _enable_binary_cache()
        record = _build_record(self.device, source, options or [])
        if on_compile is not None and not record.exists():
            on_compile()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", cl.CompilerWarning)
            try:
                program = cl.Program(self.context, source).build(options=options or [])
            except cl.Error as exc:
                raise DeviceError(f"OpenCL kernel build failed on {self.name}:\n{exc}") from exc
        try:
            record.parent.mkdir(parents=True, exist_ok=True)
            record.touch()
        except OSError:
            pass  # a read-only cache: the next run says it compiles once more, nothing worse
        for w in caught:
            if not _only_bogus(str(w.message)):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        return program

    def copy_bandwidth(self, nbytes: int = 256 << 20, repeats: int = 5) -> float:
        """Measured device-to-device copy rate in bytes/s (read + write counted)."""
        src = cl.Buffer(self.context, cl.mem_flags.READ_WRITE, nbytes)
        dst = cl.Buffer(self.context, cl.mem_flags.READ_WRITE, nbytes)
        cl.enqueue_fill_buffer(self.queue, src, np.uint8(1), 0, nbytes)
        cl.enqueue_copy(self.queue, dst, src).wait()
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            cl.enqueue_copy(self.queue, dst, src).wait()
            best = min(best, time.perf_counter() - t0)
        src.release()
        dst.release()
        return 2 * nbytes / best


# Build messages that are not about our code, passed over; any other is passed on as
# the CompilerWarning it is. NVIDIA drivers since 550 print the first two for every
# kernel, whatever its source says (openwall/john#5456, silx-kit/pyFAI#2368). PoCL on
# a CPU without AVX-512 prints clang's -Wpsabi notice for every 16-wide vector passed
# to a function, its own builtins' too: such calls stay inside one compiled program,
# so no caller can disagree about the ABI (and PoCL refuses -Wno-psabi).
_NOISE = (
    "is a kernel, so overriding noinline attribute",
    "The function may be inlined when called",
    "enabled changes the ABI",
)


def _only_bogus(message: str) -> bool:
    """Whether a build log holds nothing but notices that are not about our code."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    log = [line for line in lines if not line.endswith(":") and set(line) != {"="}]
    return bool(log) and all(any(n in line for n in _NOISE) for line in log)


# A record of each program this machine has built, one empty file per program and
# device. The compiled binaries live in pyopencl's cache or the driver's own (PoCL's
# and NVIDIA's; pyopencl then keeps none and cannot tell a hit from a miss), so
# "not built here before" is the one way to know a build will compile from scratch.
BUILT_DIR = Path(platformdirs.user_cache_dir("slotswarm")) / "built-kernels"


def _build_record(device: cl.Device, source: str, options: list[str]) -> Path:
    key = hashlib.sha256()
    for part in (source, "\0".join(options), device.name, device.platform.name, device.driver_version, device.version):
        key.update(part.encode() + b"\0")
    return BUILT_DIR / key.hexdigest()


def _enable_binary_cache() -> None:
    # pyopencl caches compiled binaries unless told not to; make sure nobody did.
    os.environ.pop("PYOPENCL_NO_CACHE", None)
    # Put the compiler's log itself in a CompilerWarning (not "non-empty output
    # encountered"), so build() can tell NVIDIA's notice from a real warning.
    os.environ["PYOPENCL_COMPILER_OUTPUT"] = "1"


def list_devices() -> list[tuple[int, int, cl.Platform, cl.Device]]:
    """Every (platform index, device index, platform, device) found."""
    found = []
    try:
        platforms = cl.get_platforms()
    except cl.Error:
        platforms = []
    for pi, platform in enumerate(platforms):
        try:
            devices = platform.get_devices()
        except cl.Error:
            continue
        for di, device in enumerate(devices):
            found.append((pi, di, platform, device))
    return found


def describe_devices() -> str:
    found = list_devices()
    if not found:
        return "no OpenCL platforms or devices found"
    return "; ".join(f"{pi}:{di} {p.name.strip()} / {d.name.strip()}" for pi, di, p, d in found)


def _cannot_compile(device: cl.Device) -> str | None:
    """Why `device` cannot build a trivial kernel, or None if it can. Cheap after
    the first run: pyopencl caches the binary."""
    _enable_binary_cache()
    try:
        cl.Program(cl.Context([device]), _PROBE).build()
    except cl.Error as exc:
        lines = [line.strip() for line in str(exc).splitlines() if "error" in line.lower()]
        return (lines[-1] if lines else str(exc).strip())[:200]
    return None


def _matches(part: str, index: int, name: str) -> bool:
    part = part.strip()
    if part == "":
        return True
    if part.isdigit():
        return int(part) == index
    return part.lower() in name.lower()


def _pick(spec: str) -> cl.Device:
    plat_part, _, dev_part = spec.partition(":") if ":" in spec else ("", "", spec)
    for pi, di, platform, device in list_devices():
        if _matches(plat_part, pi, platform.name) and _matches(dev_part, di, device.name):
            return device
    raise DeviceError(f"no OpenCL device matches {spec!r}; found: {describe_devices()}")


def select_device(spec: str | None = None) -> Device:
    """Choose a device (see the module doc) and open a context and queue on it."""
    spec = spec or os.environ.get("SWARM_DEVICE") or os.environ.get("PYOPENCL_CTX") or None
    if spec:
        device = _pick(spec)
    else:
        found = list_devices()
        if not found:
            raise DeviceError(f"no usable OpenCL device: {describe_devices()}. {INSTALL_HINT}")
        gpus = [d for _, _, _, d in found if d.type & cl.device_type.GPU]
        ordered = gpus + [d for _, _, _, d in found if not d.type & cl.device_type.GPU]
        failures = []
        for device in ordered:
            problem = _cannot_compile(device)
            if problem is None:
                break
            failures.append(f"{device.name.strip()}: {problem}")
        else:
            raise DeviceError(f"no OpenCL device can compile a kernel ({'; '.join(failures)}). {INSTALL_HINT}")
    try:
        context = cl.Context([device])
        queue = cl.CommandQueue(context, device)
    except cl.Error as exc:
        raise DeviceError(f"cannot open OpenCL device {device.name.strip()}: {exc}; found: {describe_devices()}. {INSTALL_HINT}") from exc
    return Device(device, context, queue)
