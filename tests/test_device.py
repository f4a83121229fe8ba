"""Choosing the OpenCL device and building programs on it."""

from __future__ import annotations

import uuid

import numpy as np
import pyopencl as cl
import pytest

from gpu.device import describe_devices, list_devices, select_device
from runtime.errors import DeviceError


def test_default_choice_opens_a_device() -> None:
    device = select_device()
    found = list_devices()
    assert device.device.int_ptr in [d.int_ptr for *_, d in found]
    gpus = [d for *_, d in found if d.type & cl.device_type.GPU]
    if gpus:  # a GPU is preferred whenever there is one
        assert device.device.int_ptr == gpus[0].int_ptr
    assert device.device.name.strip() in describe_devices()


def test_spec_by_index_and_by_name_substring() -> None:
    pi, di, platform, dev = list_devices()[0]
    assert select_device(f"{pi}:{di}").device.int_ptr == dev.int_ptr
    word = dev.name.split()[0][:6]
    assert select_device(f":{word.lower()}").device.int_ptr == dev.int_ptr
    assert select_device(word.upper()).device.int_ptr == dev.int_ptr  # no colon: any platform


def test_unknown_spec_lists_what_was_found() -> None:
    with pytest.raises(DeviceError, match=r"no OpenCL device matches 'no-such-device'; found: 0:0 "):
        select_device("no-such-device")


def test_pyopencl_ctx_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYOPENCL_CTX", "7:7")
    with pytest.raises(DeviceError, match="'7:7'"):
        select_device()
    assert select_device("0:0")  # an explicit spec wins over the environment


def test_build_failure_carries_the_build_log() -> None:
    device = select_device()
    with pytest.raises(DeviceError, match=r"(?s)kernel build failed.*undeclared_thing"):
        device.build("__kernel void broken(__global float *x) { x[0] = undeclared_thing; }")


def test_a_build_says_when_it_compiles_and_not_when_the_cache_has_it(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A program this machine has not built before (its source names this test's
    own nonce) says so before it compiles; built again, it says nothing."""
    monkeypatch.setattr("gpu.device.BUILT_DIR", tmp_path)
    device = select_device()
    source = f"__kernel void nonce_{uuid.uuid4().hex}(__global int *x) {{ x[0] = 1; }}"
    said: list[str] = []
    device.build(source, on_compile=lambda: said.append("cold"))
    assert said == ["cold"]
    device.build(source, on_compile=lambda: said.append("warm"))
    assert said == ["cold"]


def test_an_engine_says_nothing_of_compiling_when_its_kernels_are_cached(tiny_model) -> None:
    from gpu.engine import OpenCLEngine

    first: list[str] = []
    OpenCLEngine(tiny_model, num_blocks=8, on_compile=first.append)
    assert len(first) <= 1 and all("compiling the" in line and "takes a while" in line for line in first)
    again: list[str] = []
    OpenCLEngine(tiny_model, num_blocks=8, on_compile=again.append)
    assert again == []


def test_a_real_build_warning_is_passed_on() -> None:
    device = select_device()
    source = f"#warning a real one\n__kernel void nonce_{uuid.uuid4().hex}(__global int *x) {{ x[0] = 1; }}"
    with pytest.warns(cl.CompilerWarning, match="a real one"):
        device.build(source)


def test_wide_vectors_passed_to_functions_build_without_a_word() -> None:
    """PoCL on a CPU without AVX-512 notes that 16-wide vector arguments change the
    ABI (every kernel family passes them); that notice is not a warning about our code."""
    device = select_device()
    source = f"""
    float16 scaled(float16 a, uint16 b) {{ return a * convert_float16(b); }}
    __kernel void nonce_{uuid.uuid4().hex}(__global float16 *x, __global uint16 *y) {{
        x[get_global_id(0)] = scaled(x[get_global_id(0)], y[get_global_id(0)]) + as_float16(y[0]);
    }}"""
    device.build(source)  # (the suite turns any warning into an error)


def test_build_succeeds_and_the_program_runs() -> None:
    device = select_device()
    program = device.build("__kernel void twice(__global float *x) { x[get_global_id(0)] *= 2.0f; }")
    host = np.arange(8, dtype=np.float32)
    buf = cl.Buffer(device.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
    program.twice(device.queue, (8,), None, buf)
    cl.enqueue_copy(device.queue, host, buf)
    assert host.tolist() == [2.0 * i for i in range(8)]


@pytest.mark.parametrize("kernels", ["cpu", "gpu"])
def test_a_step_on_a_host_cpu_device_lets_go_of_the_gil_between_launches(tiny_model, kernels: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # PoCL's worker threads share the host's cores: the enqueuing thread must not
    # sit on the GIL while they keep it off the CPU, or the event loop stalls. It
    # enqueues the step in groups and waits (without the GIL) between them.
    import pyopencl as cl

    import gpu.engine
    from gpu.engine import OpenCLEngine
    from runtime.scheduling.work import CHECK_POINTS, Work

    engine = OpenCLEngine(tiny_model, num_blocks=16, block_size=16, kernels=kernels)
    waits: list[int] = []
    enqueue_marker = cl.enqueue_marker

    class Counted:
        def __init__(self, queue):
            self.event = enqueue_marker(queue)

        def wait(self):
            waits.append(1)
            self.event.wait()

    monkeypatch.setattr(gpu.engine.cl, "enqueue_marker", Counted)
    engine.step([Work(turn=0, tokens=[1, 2, 3], start=0, block_table=[0], sample=True)])
    assert engine.device.is_cpu  # PoCL, in CI
    launches = 2 + len(engine.launches.layers) + len(engine.launches.head)  # embed, the layers, the head's, argmax
    assert len(waits) == -(-launches // -(-launches // CHECK_POINTS)) - 1 >= 1
