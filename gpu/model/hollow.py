"""A hollow twin of a GGUF model: the same header, metadata, tensor shapes and
types, with every tensor's bytes zero.

A step's time does not depend on weight values, so where a model file cannot be
brought to a machine (a lent GPU machine reaches no registry and takes 64 MiB
of files), its hollow twin serves for timing: sparse on disk, and gzip makes
SmolLM2-135M's 98 MB a few hundred KB, nearly all of it the tokenizer. Its
tokens mean nothing: every weight is zero, so every logit is, and greedy picks
token 0.

    swarm models --hollow smollm2-135m smollm2-hollow.gguf
"""

from __future__ import annotations

from pathlib import Path

from gpu.model.gguf_file import read_gguf


def write_hollow(source: Path, target: Path) -> int:
    """Write the hollow twin of `source` to `target`; the bytes kept (the header:
    metadata and tokenizer, a few MB at most)."""
    _, tensors = read_gguf(source)
    size = source.stat().st_size
    data_start = min((t.offset for t in tensors), default=size)
    with open(source, "rb") as src, open(target, "wb") as out:
        out.write(src.read(data_start))
        out.truncate(size)  # the tensor data: zeros, a hole where the file system allows
    return data_start
