"""The OpenCL engine against the NumPy reference on one synthetic model per architecture and
one per tensor type: prefill, then decode past Gemma's sliding window, logits compared."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from gpu.engine import OpenCLEngine
from gpu.model import load_model
from gpu.reference import ReferenceModel
from gpu.synthetic import write_tiny_gguf
from runtime.engine import Work
from runtime.errors import UnsupportedModelError

Q = gguf.GGMLQuantizationType
TYPES = (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.BF16, Q.F16, Q.F32)
# One shape for every model, so each architecture compiles its kernels once; 256 wide for the
# K-quants' blocks; head_dim 32 so two heads share each KV head.
SHAPE = dict(d_model=256, d_ff=512, n_heads=8, n_kv_heads=4, n_layers=6, sliding_window=8)


def compare(path: Path, steps: int = 6, kernels: str = "cpu") -> None:
    model = load_model(path)
    engine = OpenCLEngine(model, num_blocks=8, block_size=16, kernels=kernels)
    reference = ReferenceModel(model)
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, model.config.vocab_size, 13).tolist()
    cache = reference.new_cache()
    table = [3, 1, 6]
    want = reference.forward(tokens, 0, cache)[-1]
    got = engine.step_logits([Work(turn=0, tokens=tokens, start=0, block_table=table, sample=True)])[0]
    for k in range(steps):
        err = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert err < 2e-3, f"step {k}: relative error {err:.2e}"
        token = int(np.argmax(want))
        position = len(tokens) + k
        want = reference.forward([token], position, cache)[-1]
        got = engine.step_logits([Work(turn=0, tokens=[token], start=position, block_table=table, sample=True)])[0]


@pytest.mark.parametrize("kernels", ["cpu", "gpu"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
def test_architecture_matches_reference(tmp_path: Path, arch: str, kernels: str) -> None:
    path = write_tiny_gguf(tmp_path / "m.gguf", arch=arch, weight_type=Q.Q4_K, embed_type=Q.Q6_K,
                           tied=arch == "gemma3", llama3_rope=arch == "llama", **SHAPE)
    if kernels == "gpu" and arch == "gemma3":
        with pytest.raises(UnsupportedModelError, match="post-norms and sliding-window attention"):
            OpenCLEngine(load_model(path), num_blocks=8, kernels="gpu")
        assert OpenCLEngine(load_model(path), num_blocks=8, kernels="auto").kernels == "cpu"
        return
    compare(path, kernels=kernels)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_tensor_type_matches_reference(tmp_path: Path, qtype) -> None:
    compare(write_tiny_gguf(tmp_path / "m.gguf", weight_type=qtype, embed_type=qtype, tied=False, **SHAPE), steps=2)


@pytest.mark.parametrize("v_type, kind", [(Q.Q8_0, "q8_0"), (Q.Q6_K, "q8x2")])
def test_mixed_qkv_types_match_reference(tmp_path: Path, v_type, kind: str) -> None:
    """Q and K in one type, V in another (as in Qwen2.5's and Gemma 3's files): one matrix of
    the narrowest kind that holds both exactly."""
    path = write_tiny_gguf(tmp_path / "m.gguf", arch="qwen2", weight_type=Q.Q5_0 if kind == "q8_0" else Q.Q4_K,
                           v_type=v_type, **SHAPE)
    assert OpenCLEngine(load_model(path), num_blocks=8).weights.layers[0].qkv.kind == kind
    compare(path, steps=2)


@pytest.mark.parametrize("qtype", (Q.Q5_0, Q.Q2_K, Q.Q8_0, Q.BF16), ids=lambda q: q.name)
def test_gpu_family_reads_the_other_kinds(tmp_path: Path, qtype) -> None:
    """The GPU family's matmuls read weights through the same load_block: q5, q4x2, q8_0, f32
    (q4_1 and q6 are covered above), and a Q/K/V stack of mixed kinds as q8x2."""
    compare(write_tiny_gguf(tmp_path / "m.gguf", weight_type=qtype, embed_type=qtype, tied=False,
                            v_type=Q.Q6_K if qtype == Q.Q2_K else None, **SHAPE), steps=2, kernels="gpu")  # fmt: skip
