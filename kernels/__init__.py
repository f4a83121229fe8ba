"""OpenCL C sources for the decode engine, shipped as package data.

    quant.cl    every weight type's dequantization, the one place a type is defined
    common.cl   what both families share: the KV layout, RoPE + K/V store, embedding, argmax
    cpu/        the CPU-shaped family: a work-item walks whole rows, wide vectors
    gpu/        the GPU-shaped family: work-groups cooperate, tiles through local memory

`source("cpu/matmul")` returns the text of `kernels/cpu/matmul.cl`.
"""

from __future__ import annotations

from importlib import resources


def source(name: str) -> str:
    """The OpenCL C source of `kernels/<name>.cl`."""
    path = resources.files(__name__).joinpath(*f"{name}.cl".split("/"))
    if not path.is_file():
        raise FileNotFoundError(f"no kernel source named {name!r} (looked for {path})")
    return path.read_text(encoding="utf-8")
