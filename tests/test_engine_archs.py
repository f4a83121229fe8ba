"""The OpenCL engine against the NumPy reference on one synthetic model per architecture and
one per tensor type: prefill, then decode past Gemma's sliding window, logits compared."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from reference import ReferenceModel, for_engine

from gpu.device import select_device
from gpu.engine import OpenCLEngine
from gpu.families import CPUFamily, GPUTuning, family_weights, make_family
from gpu.launches import CPUMatmul
from gpu.model.load import load_model
from gpu.model.synthetic import write_tiny_gguf
from runtime.errors import ConfigError
from runtime.scheduling.work import Work

Q = gguf.GGMLQuantizationType
TYPES = (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.BF16, Q.F16, Q.F32)
# One shape for every model, so each architecture compiles its kernels once; 256 wide for the
# K-quants' blocks; head_dim 32 so two heads share each KV head.
SHAPE = dict(d_model=256, d_ff=512, n_heads=8, n_kv_heads=4, n_layers=6, sliding_window=8)
# Everything the CPU family runs, the GPU family runs too: every architecture, every tensor
# type and every mixed Q/K/V stack, each against the reference on both.
FAMILIES = pytest.mark.parametrize("kernels", ["cpu", "gpu"])


@pytest.fixture(autouse=True)
def sixteen_bit_inputs(monkeypatch) -> None:
    """The CPU family's compact Q4_K and Q6_K on 16-bit inputs (SLOTSWARM_INT8=0), as the
    reference takes them. On 8-bit ones an input near a rounding boundary lands on either side
    of it in the engine's float sums and a rounding reference's, and these random models grow
    such a flip into percents of the logits; those kernels are checked against the rounding
    reference in test_nibbles, and on a real model in test_real_models."""
    monkeypatch.setenv("SLOTSWARM_INT8", "0")


def compare(path: Path, steps: int = 6, kernels: str = "cpu", span: int | None = None) -> None:
    model = load_model(path)
    engine = OpenCLEngine(model, num_blocks=8, block_size=16, kernels=kernels, gpu_tuning=None if span is None else GPUTuning(span=span))
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


@FAMILIES
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
def test_architecture_matches_reference(tmp_path: Path, arch: str, kernels: str) -> None:
    path = write_tiny_gguf(
        tmp_path / "m.gguf", arch=arch, weight_type=Q.Q4_K, embed_type=Q.Q6_K, tied=arch == "gemma3", llama3_rope=arch == "llama", **SHAPE
    )
    compare(path, kernels=kernels)


@FAMILIES
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_tensor_type_matches_reference(tmp_path: Path, qtype, kernels: str) -> None:
    path = write_tiny_gguf(tmp_path / "m.gguf", weight_type=qtype, embed_type=qtype, tied=False, **SHAPE)
    compare(path, steps=2, kernels=kernels)


@FAMILIES
@pytest.mark.parametrize("compact", [0, 1], ids=["widened", "compact"])
@pytest.mark.parametrize("qk_type, v_type", [(Q.Q5_0, Q.Q8_0), (Q.Q4_K, Q.Q6_K)], ids=["Q5_0-Q8_0", "Q4_K-Q6_K"])
def test_mixed_qkv_types_match_reference(tmp_path: Path, qk_type, v_type, kernels: str, compact: int, monkeypatch) -> None:
    """Q and K in one type, V in another (as in Qwen2.5's and Gemma 3's files): on the CPU
    family, two parts each in its own kind (a launch each, V's from its first row), with
    SLOTSWARM_COMPACT as stored in the file; on the GPU family, one matrix of the narrowest
    kind that holds both."""
    monkeypatch.setenv("SLOTSWARM_COMPACT", str(compact))
    path = write_tiny_gguf(tmp_path / "m.gguf", arch="qwen2", weight_type=qk_type, v_type=v_type, **SHAPE)
    qkv = OpenCLEngine(load_model(path), num_blocks=8, kernels=kernels).weights.layers[0].qkv
    if kernels == "cpu":
        kinds = {Q.Q5_0: ("q5", "q5_0"), Q.Q8_0: ("q8_0", "q8_0"), Q.Q4_K: ("q4_1", "q4_k"), Q.Q6_K: ("q6", "q6_k")}
        want = [(kinds[qk_type][compact], 0), (kinds[v_type][compact], SHAPE["d_model"] * 3 // 2)]
        assert [(m.kind, m.first_row) for m in qkv.parts] == want
        if compact:  # (q8_0: a float scale a block)
            assert all(m.nbytes == m.file_bytes for m in qkv.parts if m.kind != "q8_0")
    elif compact:
        pytest.skip("the GPU family's stack is the same one matrix")
    else:
        assert qkv.kind == ("q8_0" if v_type == Q.Q8_0 else "q8x2")
    compare(path, steps=2, kernels=kernels)


@FAMILIES
@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q5_0], ids=lambda q: q.name)
def test_compact_kinds_match_reference(tmp_path: Path, qtype, kernels: str, monkeypatch) -> None:
    """SLOTSWARM_COMPACT: the types kept in their file's bytes, every layer matrix and the head."""
    monkeypatch.setenv("SLOTSWARM_COMPACT", "1")
    path = write_tiny_gguf(tmp_path / "m.gguf", weight_type=qtype, embed_type=qtype, tied=False, **SHAPE)
    w = OpenCLEngine(load_model(path), num_blocks=8, kernels=kernels).weights
    assert w.bytes_per_step() == w.file_bytes_per_step()
    compare(path, steps=2, kernels=kernels)


# SLOTSWARM_COMPACT: (the CPU family's kinds for Q4_K, Q6_K and Q5_0, the GPU family's)
COMPACT_SETTINGS = [(None, ("q4_k", "q6_k", "q5"), ("q4_1", "q6", "q5")), ("0", ("q4_1", "q6", "q5"), ("q4_1", "q6", "q5")),
                    ("1", ("q4_k", "q6_k", "q5_0"), ("q4_k", "q6_k", "q5_0"))]  # fmt: skip


@pytest.mark.parametrize("setting, cpu_kinds, gpu_kinds", COMPACT_SETTINGS, ids=["default", "off", "on"])
def test_compact_kinds_follow_each_familys_default(tmp_path: Path, setting, cpu_kinds, gpu_kinds, monkeypatch) -> None:
    """Unless SLOTSWARM_COMPACT says otherwise, the CPU family keeps Q4_K and Q6_K compact and
    widens Q5_0, and the GPU family widens all three."""
    if setting is None:
        monkeypatch.delenv("SLOTSWARM_COMPACT", raising=False)
    else:
        monkeypatch.setenv("SLOTSWARM_COMPACT", setting)
    device = select_device()
    for kernels, kinds in (("cpu", cpu_kinds), ("gpu", gpu_kinds)):
        family = make_family(kernels, device)
        for qtype, kind in zip((Q.Q4_K, Q.Q6_K, Q.Q5_0), kinds, strict=True):
            path = write_tiny_gguf(tmp_path / f"{qtype.name}.gguf", weight_type=qtype, embed_type=Q.Q8_0, tied=False, **SHAPE)
            assert family_weights(family, device, load_model(path)).layers[0].down.kind == kind


def test_gpu_family_splits_a_sliding_window(tmp_path: Path) -> None:
    """Gemma 3 on the GPU family with attention cut into splits of 3 positions: the sliding
    window of 8 is 3 splits per (token, KV head), each a share of the window only, and the
    last to finish combines them."""
    path = write_tiny_gguf(tmp_path / "m.gguf", arch="gemma3", weight_type=Q.Q8_0, embed_type=Q.Q8_0, tied=True, **SHAPE)
    compare(path, steps=6, kernels="gpu", span=3)


def test_gpu_family_attention_gives_the_same_bits_every_run(tmp_path: Path) -> None:
    """The same prompt ten times, its attention in one split and in several: the same
    logits each time. (PoCL 3.1 with two threads gave a few (token, KV head) groups
    another group's outputs, or zeros, where a barrier followed a return.)"""
    path = write_tiny_gguf(tmp_path / "m.gguf", arch="gemma3", weight_type=Q.Q8_0, embed_type=Q.Q8_0, tied=True, **SHAPE)
    model = load_model(path)
    prompt = np.random.default_rng(4).integers(0, model.config.vocab_size, 13).tolist()
    for span in (256, 3):
        engine = OpenCLEngine(model, num_blocks=8, block_size=16, kernels="gpu", gpu_tuning=GPUTuning(span=span))
        runs = {
            engine.step_logits([Work(turn=k, tokens=prompt, start=0, block_table=[3, 1, 6], sample=True)])[0].tobytes() for k in range(10)
        }
        assert len(runs) == 1, f"span {span}: {len(runs)} different results in 10 runs"


@pytest.mark.parametrize("setting", ["0", "1"])
def test_a_prompt_s_tile_width_changes_no_bit(tmp_path: Path, setting: str, monkeypatch) -> None:
    """The CPU family reads a prompt's columns through Q4_K and Q6_K on 8-bit inputs in
    32-column tiles, and through the other nibble kinds 8 at a time, unless SLOTSWARM_GEMM
    says 1 (every kind 32) or 0 (none); the logits are the same bits every way."""
    monkeypatch.setenv("SLOTSWARM_INT8", "1")
    monkeypatch.delenv("SLOTSWARM_GEMM", raising=False)
    path = write_tiny_gguf(tmp_path / "m.gguf", arch="qwen2", weight_type=Q.Q4_K, v_type=Q.Q6_K, embed_type=Q.Q8_0, **SHAPE)
    model = load_model(path)
    prompt = np.random.default_rng(2).integers(0, model.config.vocab_size, 40).tolist()

    def prefill() -> tuple[set[int], set[int], np.ndarray]:
        engine = OpenCLEngine(model, num_blocks=8, kernels="cpu")
        widest = lambda launches: {launch.gemm_tile for launch in launches if isinstance(launch, CPUMatmul)}  # noqa: E731
        logits = engine.step_logits([Work(turn=0, tokens=prompt, start=0, block_table=[3, 1, 6], sample=True)])[0]
        return widest(engine.launches.layers), widest(engine.launches.head), logits

    layers, head, logits = prefill()
    assert (layers, head) == ({32}, {8})  # Q4_K and Q6_K; Q8_0
    monkeypatch.setenv("SLOTSWARM_GEMM", setting)
    layers, head, same = prefill()
    assert layers == head == {32 if setting == "1" else 8}
    assert same.tobytes() == logits.tobytes()


@pytest.mark.parametrize("layer_launch", ["1", "0"])
@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1], ids=lambda q: q.name)
def test_q4_on_8_bit_inputs_matches_a_reference_that_rounds_them(tmp_path: Path, qtype, layer_launch: str, monkeypatch) -> None:
    """SLOTSWARM_INT8=all: the CPU family's Q4_0 and Q4_1 matmuls take 8-bit inputs too, in a
    launch a layer and in five: a token's logits are not the 16-bit engine's bits, and match a
    reference that rounds the same inputs to the percents that f16 V leaves (the output
    projection rounds attention's outputs, from f16 V in the engine and float32 in the
    reference, and an input near a rounding boundary lands on either side of it; the kernels
    themselves match it to float error in test_nibbles)."""
    monkeypatch.setenv("SLOTSWARM_LAYER_LAUNCH", layer_launch)
    model = load_model(write_tiny_gguf(tmp_path / "m.gguf", weight_type=qtype, embed_type=Q.Q8_0, tied=True, **SHAPE))
    work = Work(turn=0, tokens=[7], start=0, block_table=[3], sample=True)
    sixteen = OpenCLEngine(model, num_blocks=8, kernels="cpu").step_logits([work])[0]
    monkeypatch.setenv("SLOTSWARM_INT8", "all")
    engine = OpenCLEngine(model, num_blocks=8, kernels="cpu")
    assert engine.family.int8_nibbles
    got = engine.step_logits([work])[0]
    reference = for_engine(model, engine)
    want = reference.forward([7], 0, reference.new_cache())[-1]
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 0.1
    assert got.tobytes() != sixteen.tobytes()


def test_an_unknown_int8_setting_is_a_config_error(monkeypatch) -> None:
    monkeypatch.setenv("SLOTSWARM_INT8", "ALL")
    with pytest.raises(ConfigError, match="SLOTSWARM_INT8 must be 0, 1 or all, got 'ALL'"):
        CPUFamily(select_device())
