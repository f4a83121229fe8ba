"""Model weights on the device, still quantized.

GGUF stores a quantized row as a run of blocks of 32 weights, each block its
scale(s) followed by its quants (Q4_1: f16 d, f16 m, 16 bytes of nibbles; Q8_0:
f16 d, 32 int8). Those 20- and 34-byte blocks are not 16-byte aligned, so the
upload splits each matrix into two arrays, the quants (`qs`) and the scales
(`dm`), so the kernels can use aligned vector loads. The scales are widened to
float32 (see kernels/quant.cl for why). Types the kernels do not read directly
are dequantized to float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import gguf
import numpy as np
import pyopencl as cl

from gpu.model import WeightTensor
from runtime.errors import UnsupportedModelError

Q = gguf.GGMLQuantizationType

# qtype -> (kernel suffix, bytes of scales at the start of each block)
_NATIVE = {Q.Q4_1: ("q4_1", 4), Q.Q8_0: ("q8_0", 2)}


@dataclass
class DeviceMatrix:
    """A [rows, cols] weight matrix on the device: kind is the kernel suffix."""

    kind: str  # "q4_1" | "q8_0" | "f32"
    rows: int
    cols: int
    qs: cl.Buffer
    dm: cl.Buffer
    nbytes: int  # bytes a full pass over the matrix reads


def _buffer(context: cl.Context, array: np.ndarray) -> cl.Buffer:
    array = np.ascontiguousarray(array)
    if array.nbytes == 0:
        array = np.zeros(4, np.uint8)
    return cl.Buffer(context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=array)


def pack(tensors: Sequence[WeightTensor]) -> tuple[str, np.ndarray, np.ndarray]:
    """Stack the rows of `tensors` into one matrix and split it into (kind, qs, dm)."""
    cols = tensors[0].cols
    if any(t.cols != cols for t in tensors):
        raise UnsupportedModelError(f"cannot stack {[t.name for t in tensors]}: different widths")
    if cols % 32:
        raise UnsupportedModelError(f"{tensors[0].name}: width {cols} is not a multiple of 32")
    qtypes = {t.qtype for t in tensors}
    if len(qtypes) == 1 and (qtype := qtypes.pop()) in _NATIVE:
        kind, scale_bytes = _NATIVE[qtype]
        raw = np.concatenate([t.raw for t in tensors]) if len(tensors) > 1 else tensors[0].raw
        rows = raw.shape[0]
        blocks = np.asarray(raw, np.uint8).reshape(rows, cols // 32, -1)
        scales = np.ascontiguousarray(blocks[:, :, :scale_bytes]).view(np.float16).astype(np.float32)
        return kind, blocks[:, :, scale_bytes:].copy(), scales
    dense = np.concatenate([t.dequantize().reshape(t.rows, t.cols) for t in tensors])
    return "f32", dense.astype(np.float32), np.zeros(4, np.uint8)


def upload_matrix(context: cl.Context, tensors: Sequence[WeightTensor]) -> DeviceMatrix:
    kind, qs, dm = pack(tensors)
    rows = sum(t.rows for t in tensors)
    nbytes = qs.nbytes + (dm.nbytes if kind != "f32" else 0)
    return DeviceMatrix(kind, rows, tensors[0].cols, _buffer(context, qs), _buffer(context, dm), nbytes)


def upload_vector(context: cl.Context, tensor: WeightTensor) -> cl.Buffer:
    return _buffer(context, tensor.dequantize().reshape(-1).astype(np.float32))


@dataclass
class LayerWeights:
    attn_norm: cl.Buffer
    qkv: DeviceMatrix  # q rows, then k rows, then v rows
    out: DeviceMatrix
    ffn_norm: cl.Buffer
    gate_up: DeviceMatrix  # gate rows, then up rows
    down: DeviceMatrix


@dataclass
class ModelWeights:
    embed: DeviceMatrix
    layers: list[LayerWeights]
    output_norm: cl.Buffer
    output: DeviceMatrix

    def bytes_per_step(self) -> int:
        """Weight bytes one step reads (every layer matrix and the output head)."""
        per_layer = sum(m.nbytes for layer in self.layers for m in (layer.qkv, layer.out, layer.gate_up, layer.down))
        return per_layer + self.output.nbytes


def upload_weights(context: cl.Context, model) -> ModelWeights:
    """Every tensor of a Llama `gpu.model.Model`, packed and on the device."""
    layers = []
    for i in range(model.config.n_layers):
        t = lambda name: model.tensor(f"blk.{i}.{name}.weight")  # noqa: E731
        layers.append(
            LayerWeights(
                attn_norm=upload_vector(context, t("attn_norm")),
                qkv=upload_matrix(context, [t("attn_q"), t("attn_k"), t("attn_v")]),
                out=upload_matrix(context, [t("attn_output")]),
                ffn_norm=upload_vector(context, t("ffn_norm")),
                gate_up=upload_matrix(context, [t("ffn_gate"), t("ffn_up")]),
                down=upload_matrix(context, [t("ffn_down")]),
            )
        )
    embed = upload_matrix(context, [model.tensor("token_embd.weight")])
    output = embed if model.tied else upload_matrix(context, [model.output_weight()])
    return ModelWeights(embed, layers, upload_vector(context, model.tensor("output_norm.weight")), output)
