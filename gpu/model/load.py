"""Load a GGUF file of a described architecture (gpu/model/arch.py): its config, its weights
(memory-mapped, still quantized) and its metadata.

    model = load_model("SmolLM2-135M-Instruct.Q4_1.gguf")
    model.config.n_layers                    # 30
    w = model.tensor("blk.0.attn_q.weight")  # WeightTensor, raw GGUF bytes, no copy
    w.dequantize()                           # float32 (rows, cols)

Conventions every consumer (the NumPy reference, the OpenCL engine) relies on:

- A matrix is stored as `rows` = output features, `cols` = input features, so `y = W @ x`.
  GGUF/ggml writes shapes the other way round ([cols, rows]); we flip them here once.
- A quantized matrix's `raw` is uint8 (rows, bytes_per_row): each row is its own run of blocks.
- A 1-D tensor (an RMSNorm weight) is a "vector": rows = 1, cols = n; `dequantize()` gives (n,).
- Q and K weights are as llama.cpp's converter wrote them: for llama, permuted so that RoPE
  rotates ADJACENT pairs (x[2i], x[2i+1]) of each head (ggml rope mode 0); for the "neox"
  architectures, unpermuted, rotating (x[i], x[i + head_dim/2]). See tests/reference.py.
- Biases and per-head norm weights are vectors too; `rope_freqs.weight` (Llama 3) is read
  into the config.

Anything wrong with the file is a `ModelFormatError`; a well-formed file we cannot run (another
architecture, a tensor type we have no kernel for) is an `UnsupportedModelError`. Every message
names the file and what is wrong with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from gpu.model.arch import ARCHITECTURES, Architecture, ModelConfig, architecture, expected_shapes, read_config
from gpu.model.gguf_file import GGUFTensor, read_gguf
from gpu.model.quants import SUPPORTED_TYPES, dequantize
from runtime.errors import ModelFormatError, UnsupportedModelError

Q = gguf.GGMLQuantizationType

__all__ = ["ARCHITECTURES", "Architecture", "Model", "ModelConfig", "WeightTensor", "expected_shapes", "load_model"]


@dataclass
class WeightTensor:
    name: str
    qtype: gguf.GGMLQuantizationType
    rows: int  # output features (1 for a vector)
    cols: int  # input features (the length, for a vector)
    raw: np.ndarray  # uint8 (rows, bytes_per_row) if quantized, else float32/float16 (rows, cols)

    @property
    def is_vector(self) -> bool:
        return self.rows == 1

    @property
    def quantized(self) -> bool:
        return self.qtype not in (Q.F32, Q.F16)

    @property
    def block_size(self) -> int:
        """Weights per quantization block (1 for F32/F16)."""
        return gguf.GGML_QUANT_SIZES[self.qtype][0]

    @property
    def block_bytes(self) -> int:
        return gguf.GGML_QUANT_SIZES[self.qtype][1]

    def dequantize(self) -> np.ndarray:
        """float32 (rows, cols); a vector comes back 1-D, (cols,)."""
        out = dequantize(self.raw, self.qtype).reshape(self.rows, self.cols)
        return out[0].copy() if self.is_vector else out


@dataclass
class Model:
    path: Path
    config: ModelConfig
    tensors: dict[str, WeightTensor]
    metadata: dict[str, object]

    def tensor(self, name: str) -> WeightTensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise ModelFormatError(f"{self.path}: tensor {name!r} is missing") from None

    @property
    def tied(self) -> bool:
        """True when the output head reuses the token embedding (no output.weight)."""
        return "output.weight" not in self.tensors

    def output_weight(self) -> WeightTensor:
        return self.tensors["token_embd.weight"] if self.tied else self.tensors["output.weight"]


def load_model(path: str | Path) -> Model:
    path = Path(path).expanduser()
    if not path.is_file():
        raise ModelFormatError(f"{path}: model file not found")
    metadata, raw_tensors = read_gguf(path)
    architecture(path, metadata)  # an unknown architecture is the first thing to say
    tensors = _read_tensors(path, raw_tensors)
    config = read_config(path, metadata, tensors)
    _check_tensors(path, config, tensors)
    return Model(path=path, config=config, tensors=tensors, metadata=metadata)


# ---------------------------------------------------------------------------- reading


def _read_tensors(path: Path, raw_tensors: list[GGUFTensor]) -> dict[str, WeightTensor]:
    tensors: dict[str, WeightTensor] = {}
    for t in raw_tensors:
        qtype = t.qtype
        if qtype not in SUPPORTED_TYPES:
            supported = ", ".join(sorted(q.name for q in SUPPORTED_TYPES))
            raise UnsupportedModelError(f"{path}: tensor {t.name!r} has type {qtype.name}, which is not supported (supported: {supported})")
        shape = [int(n) for n in t.shape]  # ggml order: [cols, rows, ...]
        if len(shape) == 1:
            rows, cols = 1, shape[0]
        elif len(shape) == 2:
            cols, rows = shape
        else:
            raise ModelFormatError(f"{path}: tensor {t.name!r} has {len(shape)} dimensions {shape}")
        block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        if cols % block:
            raise ModelFormatError(f"{path}: tensor {t.name!r} has {cols} columns, not a multiple of the {qtype.name} block ({block})")
        if qtype in (Q.F32, Q.F16):  # BF16 stays raw bytes, like the block types
            expected = (rows, cols)
        else:
            expected = (rows, cols // block * block_bytes)
        tensors[t.name] = WeightTensor(name=t.name, qtype=qtype, rows=rows, cols=cols, raw=t.data.reshape(expected))
    return tensors


def _check_tensors(path: Path, config: ModelConfig, tensors: dict[str, WeightTensor]) -> None:
    shapes = expected_shapes(config)
    if "output.weight" in tensors:
        shapes["output.weight"] = (config.vocab_size, config.d_model)
    for name, (rows, cols) in shapes.items():
        if name not in tensors:
            raise ModelFormatError(f"{path}: tensor {name!r} is missing")
        t = tensors[name]
        if (t.rows, t.cols) != (rows, cols):
            raise ModelFormatError(f"{path}: tensor {name!r} has shape (rows={t.rows}, cols={t.cols}), expected (rows={rows}, cols={cols})")
