"""A fast reader for the GGUF container: metadata as Python values, tensors as memory-mapped
NumPy views (no copy).

    metadata, tensors = read_gguf(path)     # tensors: list of GGUFTensor(name, qtype, shape, data)

gguf's GGUFReader builds a NumPy view per array element: a 262,144-token vocabulary took it
30-60 s to open on the 2-core machine. This walks the header with struct.unpack_from on one
memory map instead (well under a second). Layout (little-endian):

    "GGUF", u32 version, u64 n_tensors, u64 n_kv
    n_kv x    (string key, u32 type, value)      string = u64 length + UTF-8 bytes
    n_tensors x (string name, u32 n_dims, u64 dims[n_dims] (ggml order), u32 type, u64 offset)
    padding to general.alignment (32), then the tensor data, each at its offset
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from runtime.errors import ModelFormatError
from runtime.scheduling.units import ceil_div

# value type -> struct format (gguf.GGUFValueType numbering)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_DTYPES = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8", 12: "<f8"}
STRING, ARRAY = 8, 9
_MAX_DIMS = 4  # ggml's GGML_MAX_DIMS


@dataclass
class GGUFTensor:
    name: str
    qtype: gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # ggml order: [cols, rows, ...]
    data: np.ndarray  # raw: uint8 bytes for block types, float32/float16 for F32/F16
    offset: int = 0  # where its data starts in the file


class _Cursor:
    def __init__(self, buf: memoryview) -> None:
        self.buf, self.at = buf, 0

    def scalar(self, fmt: str):
        (value,) = struct.unpack_from(fmt, self.buf, self.at)
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        raw = bytes(self.buf[self.at : self.at + n])
        if len(raw) != n:
            raise struct.error("string runs past the end of the file")
        self.at += n
        return raw.decode("utf-8", errors="replace")

    def value(self, kind: int):
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            item, n = self.scalar("<I"), self.scalar("<Q")
            if item == STRING:
                return [self.string() for _ in range(n)]
            if item in _DTYPES:
                dtype = np.dtype(_DTYPES[item])
                if n * dtype.itemsize > len(self.buf) - self.at:
                    raise struct.error(f"an array of {n} values runs past the end of the file")
                out = np.frombuffer(self.buf, dtype, count=n, offset=self.at)
                self.at += n * dtype.itemsize
                return [bool(x) for x in out] if item == 7 else out.tolist()
            return [self.value(item) for _ in range(n)]  # arrays of arrays
        if kind not in _SCALARS:
            raise struct.error(f"unknown value type {kind}")
        return self.scalar(_SCALARS[kind])


def read_gguf(path: Path) -> tuple[dict[str, object], list[GGUFTensor]]:
    try:
        mapped = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as e:
        raise ModelFormatError(f"{path}: cannot map the file ({e})") from e
    buf = memoryview(mapped)
    if bytes(buf[:4]) != b"GGUF":
        raise ModelFormatError(f"{path}: not a GGUF file (starts with {bytes(buf[:4])!r}, expected b'GGUF')")
    c = _Cursor(buf)
    c.at = 4
    try:
        version = c.scalar("<I")
        if version not in (2, 3):
            raise ModelFormatError(f"{path}: GGUF version {version} is not supported (only 2 and 3)")
        n_tensors, n_kv = c.scalar("<Q"), c.scalar("<Q")
        metadata: dict[str, object] = {}
        for _ in range(n_kv):
            key = c.string()
            metadata[key] = c.value(c.scalar("<I"))
        infos = []
        for _ in range(n_tensors):
            name = c.string()
            n_dims = c.scalar("<I")
            if not 1 <= n_dims <= _MAX_DIMS:
                raise ModelFormatError(f"{path}: tensor {name!r} has {n_dims} dimensions (a GGUF tensor has 1 to {_MAX_DIMS})")
            dims = tuple(c.scalar("<Q") for _ in range(n_dims))
            infos.append((name, dims, c.scalar("<I"), c.scalar("<Q")))
    except (struct.error, UnicodeDecodeError, ValueError) as e:
        raise ModelFormatError(f"{path}: corrupt or truncated GGUF header ({e})") from e
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment < 1:
        raise ModelFormatError(f"{path}: general.alignment = {alignment!r} is not a positive integer")
    start = ceil_div(c.at, alignment) * alignment
    tensors = []
    for name, dims, kind, offset in infos:
        try:
            qtype = gguf.GGMLQuantizationType(kind)
        except ValueError:
            raise ModelFormatError(f"{path}: tensor {name!r} has unknown type {kind}") from None
        tensors.append(GGUFTensor(name, qtype, dims, _data(path, mapped, start + offset, qtype, dims, name), start + offset))
    return metadata, tensors


def _data(path: Path, mapped: np.ndarray, at: int, qtype, dims: tuple[int, ...], name: str) -> np.ndarray:
    count = math.prod(dims)  # Python ints: a corrupt dimension must not wrap around to a small count
    block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    if count % block:
        raise ModelFormatError(f"{path}: tensor {name!r} has {count} weights, not whole {qtype.name} blocks")
    nbytes = count // block * block_bytes
    if at + nbytes > len(mapped):
        raise ModelFormatError(f"{path}: tensor {name!r} runs past the end of the file (truncated file?)")
    raw = mapped[at : at + nbytes]
    if qtype == gguf.GGMLQuantizationType.F32:
        return raw.view(np.float32)
    if qtype == gguf.GGMLQuantizationType.F16:
        return raw.view(np.float16)
    return raw
