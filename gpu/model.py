"""Load a llama-architecture GGUF file: its config, its weights (memory-mapped) and its metadata.

    model = load_model("SmolLM2-135M-Instruct.Q4_1.gguf")
    model.config.n_layers                    # 30
    w = model.tensor("blk.0.attn_q.weight")  # WeightTensor, raw GGUF bytes, no copy
    w.dequantize()                           # float32 (rows, cols)

Conventions every consumer (the NumPy reference, the OpenCL engine) relies on:

- A matrix is stored as `rows` = output features, `cols` = input features, so `y = W @ x`.
  GGUF/ggml writes shapes the other way round ([cols, rows]); we flip them here once.
- A quantized matrix's `raw` is uint8 (rows, bytes_per_row): each row is its own run of blocks.
- A 1-D tensor (an RMSNorm weight) is a "vector": rows = 1, cols = n; `dequantize()` gives (n,).
- Q and K weights are as llama.cpp's converter wrote them: permuted so that RoPE rotates
  ADJACENT pairs (x[2i], x[2i+1]) of each head (ggml rope mode 0). See gpu/reference.py.

Anything wrong with the file is a `ModelFormatError`; a well-formed file we cannot run (another
architecture, a tensor type we have no kernel for) is an `UnsupportedModelError`. Every message
names the file and what is wrong with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import msgspec
import numpy as np

from runtime.errors import ModelFormatError, UnsupportedModelError

Q = gguf.GGMLQuantizationType

# The tensor types both the reference and the OpenCL kernels know how to read.
SUPPORTED_TYPES: frozenset[gguf.GGMLQuantizationType] = frozenset({Q.F32, Q.F16, Q.Q8_0, Q.Q4_1})

ARCHITECTURE = "llama"

LAYER_TENSORS = (
    "attn_norm",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
)


class ModelConfig(msgspec.Struct, frozen=True):
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    vocab_size: int
    rope_base: float
    norm_eps: float
    context_length: int

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def group_size(self) -> int:
        """Query heads per KV head (grouped-query attention)."""
        return self.n_heads // self.n_kv_heads


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
        if self.quantized:
            out = gguf.quants.dequantize(self.raw, self.qtype)
        else:
            out = self.raw
        out = np.asarray(out, dtype=np.float32).reshape(self.rows, self.cols)
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
    reader = _open(path)
    metadata = _read_metadata(path, reader)
    arch = metadata.get("general.architecture")
    if arch is None:
        raise ModelFormatError(f"{path}: metadata key 'general.architecture' is missing")
    if arch != ARCHITECTURE:
        raise UnsupportedModelError(
            f"{path}: architecture {arch!r} is not supported (only {ARCHITECTURE!r})"
        )
    config = _read_config(path, metadata)
    tensors = _read_tensors(path, reader)
    _check_tensors(path, config, tensors)
    return Model(path=path, config=config, tensors=tensors, metadata=metadata)


# ---------------------------------------------------------------------------- reading


def _open(path: Path) -> gguf.GGUFReader:
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelFormatError(f"{path}: not a GGUF file (starts with {magic!r}, expected b'GGUF')")
    try:
        return gguf.GGUFReader(path, "r")
    except Exception as e:  # gguf raises ValueError, IndexError, struct errors... on a bad file
        raise ModelFormatError(
            f"{path}: corrupt or truncated GGUF file ({type(e).__name__}: {e})"
        ) from e


def _read_metadata(path: Path, reader: gguf.GGUFReader) -> dict[str, object]:
    metadata: dict[str, object] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):  # the header pseudo-fields (version, counts)
            continue
        try:
            metadata[key] = field.contents()
        except Exception as e:
            raise ModelFormatError(f"{path}: metadata key {key!r} is unreadable ({e})") from e
    return metadata


def _require(path: Path, metadata: dict[str, object], key: str) -> object:
    if key not in metadata:
        raise ModelFormatError(f"{path}: metadata key {key!r} is missing")
    return metadata[key]


def _read_config(path: Path, md: dict[str, object]) -> ModelConfig:
    a = ARCHITECTURE

    def integer(key: str) -> int:
        value = _require(path, md, f"{a}.{key}")
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ModelFormatError(f"{path}: metadata key '{a}.{key}' = {value!r} is not a positive integer")
        return value

    d_model = integer("embedding_length")
    n_heads = integer("attention.head_count")
    n_kv_heads = integer("attention.head_count_kv") if f"{a}.attention.head_count_kv" in md else n_heads
    if d_model % n_heads or n_heads % n_kv_heads:
        raise ModelFormatError(
            f"{path}: {n_heads} heads / {n_kv_heads} KV heads do not divide d_model {d_model}"
        )
    head_dim = integer("attention.key_length") if f"{a}.attention.key_length" in md else d_model // n_heads
    rope_dims = md.get(f"{a}.rope.dimension_count", head_dim)
    if rope_dims != head_dim:
        raise UnsupportedModelError(
            f"{path}: partial RoPE ({rope_dims} of {head_dim} head dims) is not supported"
        )
    if f"{a}.vocab_size" in md:
        vocab_size = integer("vocab_size")
    else:
        vocab_size = len(_require(path, md, "tokenizer.ggml.tokens"))  # type: ignore[arg-type]
    return ModelConfig(
        n_layers=integer("block_count"),
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        d_ff=integer("feed_forward_length"),
        vocab_size=vocab_size,
        rope_base=float(md.get(f"{a}.rope.freq_base", 10000.0)),  # type: ignore[arg-type]
        norm_eps=float(_require(path, md, f"{a}.attention.layer_norm_rms_epsilon")),  # type: ignore[arg-type]
        context_length=integer("context_length"),
    )


def _read_tensors(path: Path, reader: gguf.GGUFReader) -> dict[str, WeightTensor]:
    tensors: dict[str, WeightTensor] = {}
    for t in reader.tensors:
        qtype = Q(t.tensor_type)
        if qtype not in SUPPORTED_TYPES:
            supported = ", ".join(sorted(q.name for q in SUPPORTED_TYPES))
            raise UnsupportedModelError(
                f"{path}: tensor {t.name!r} has type {qtype.name}, which is not supported "
                f"(supported: {supported})"
            )
        shape = [int(n) for n in t.shape]  # ggml order: [cols, rows, ...]
        if len(shape) == 1:
            rows, cols = 1, shape[0]
        elif len(shape) == 2:
            cols, rows = shape
        else:
            raise ModelFormatError(f"{path}: tensor {t.name!r} has {len(shape)} dimensions {shape}")
        block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        if cols % block:
            raise ModelFormatError(
                f"{path}: tensor {t.name!r} has {cols} columns, not a multiple of the {qtype.name} block ({block})"
            )
        if qtype in (Q.F32, Q.F16):
            expected = (rows, cols)
        else:
            expected = (rows, cols // block * block_bytes)
        data = t.data
        if data.size != expected[0] * expected[1]:
            raise ModelFormatError(
                f"{path}: tensor {t.name!r} holds {data.size} elements, expected {expected} (truncated file?)"
            )
        tensors[t.name] = WeightTensor(
            name=t.name, qtype=qtype, rows=rows, cols=cols, raw=data.reshape(expected)
        )
    return tensors


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """(rows, cols) of every tensor a llama model must have; vectors are (1, n).
    output.weight is optional (absent = tied to token_embd) and not listed."""
    c = config
    shapes = {"token_embd.weight": (c.vocab_size, c.d_model), "output_norm.weight": (1, c.d_model)}
    per_layer = {
        "attn_norm": (1, c.d_model),
        "attn_q": (c.q_dim, c.d_model),
        "attn_k": (c.kv_dim, c.d_model),
        "attn_v": (c.kv_dim, c.d_model),
        "attn_output": (c.d_model, c.q_dim),
        "ffn_norm": (1, c.d_model),
        "ffn_gate": (c.d_ff, c.d_model),
        "ffn_up": (c.d_ff, c.d_model),
        "ffn_down": (c.d_model, c.d_ff),
    }
    for i in range(c.n_layers):
        for name, shape in per_layer.items():
            shapes[f"blk.{i}.{name}.weight"] = shape
    return shapes


def _check_tensors(path: Path, config: ModelConfig, tensors: dict[str, WeightTensor]) -> None:
    shapes = expected_shapes(config)
    if "output.weight" in tensors:
        shapes["output.weight"] = (config.vocab_size, config.d_model)
    for name, (rows, cols) in shapes.items():
        if name not in tensors:
            raise ModelFormatError(f"{path}: tensor {name!r} is missing")
        t = tensors[name]
        if (t.rows, t.cols) != (rows, cols):
            raise ModelFormatError(
                f"{path}: tensor {name!r} has shape (rows={t.rows}, cols={t.cols}), "
                f"expected (rows={rows}, cols={cols})"
            )
