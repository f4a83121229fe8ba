"""The CPU family's one-token steps, a launch a layer (kernels/cpu/layer.cl's decode_layer):
the same bits as five launches a layer, however many work-groups share a layer and
whether PoCL runs them side by side or one after another, and only where the layers allow."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from gpu.device import select_device
from gpu.engine import OpenCLEngine
from gpu.families import CPUFamily, family_weights, layer_launch_fits
from gpu.launches import CPULayer
from gpu.model.load import load_model
from gpu.model.synthetic import write_tiny_gguf
from runtime.scheduling.work import Work

Q = gguf.GGMLQuantizationType
SHAPE = dict(d_model=256, d_ff=512, n_heads=8, n_kv_heads=4, n_layers=3)
TABLE = [3, 1, 6]


def decode(engine: OpenCLEngine, prompt: list[int], steps: int) -> np.ndarray:
    """A prompt, then `steps` one-token steps on greedy tokens: their logits."""
    logits = [engine.step_logits([Work(turn=0, tokens=prompt, start=0, block_table=TABLE, sample=True)])[0]]
    for k in range(steps):
        token = int(np.argmax(logits[-1]))
        logits.append(engine.step_logits([Work(turn=0, tokens=[token], start=len(prompt) + k, block_table=TABLE, sample=True)])[0])
    return np.stack(logits)


def engine_for(path: Path, monkeypatch, layer_launch: str) -> OpenCLEngine:
    monkeypatch.setenv("SLOTSWARM_LAYER_LAUNCH", layer_launch)
    return OpenCLEngine(load_model(path), num_blocks=8, kernels="cpu")


STACKS = {
    "Q4_1": dict(weight_type=Q.Q4_1),
    "Q4_K-Q6_K": dict(weight_type=Q.Q4_K, v_type=Q.Q6_K),
    "Q5_0-Q8_0": dict(weight_type=Q.Q5_0, v_type=Q.Q8_0),
    "Q4_K-Q5_0-Q8_0": dict(weight_type=Q.Q4_K, k_type=Q.Q5_0, v_type=Q.Q8_0),
}


# the stacks' kinds on 8-bit inputs (SLOTSWARM_INT8), Q4_K's and Q6_K's on 16-bit ones too, and
# Q4_1's on 8-bit ones (=all)
CASES = [("Q4_1", "1"), ("Q4_1", "all"), ("Q5_0-Q8_0", "1"), ("Q4_K-Q6_K", "0"), ("Q4_K-Q6_K", "1"), ("Q4_K-Q5_0-Q8_0", "1")]


@pytest.mark.parametrize("stack, int8", CASES, ids=[f"{stack}-int8:{int8}" for stack, int8 in CASES])
def test_a_one_token_step_gives_the_bits_of_five_launches_a_layer(tmp_path: Path, stack: str, int8: str, monkeypatch) -> None:
    """Every nibble kind, a QKV stack of one, two and three parts, and the work-groups as many
    as the cores, one (all on one core) or seven (more than PoCL runs at once: those that
    come late find every phase done)."""
    monkeypatch.setenv("SLOTSWARM_INT8", int8)
    path = write_tiny_gguf(tmp_path / "m.gguf", arch="qwen2", embed_type=Q.Q8_0, **STACKS[stack], **SHAPE)
    prompt = np.random.default_rng(3).integers(0, 200, 8).tolist()  # (8 columns: no 32-column tile to compile)
    engine = engine_for(path, monkeypatch, "1")
    one_token, engine.launches.one_token = engine.launches.one_token, None
    five = decode(engine, prompt, 4)
    engine.launches.one_token = one_token
    layers = [launch for launch in one_token or [] if isinstance(launch, CPULayer)]
    assert len(layers) == SHAPE["n_layers"]
    assert len(engine.weights.layers[0].qkv.parts) == stack.count("-") + (stack.count("-") > 0)
    for groups in (layers[0].cores, 1, 7):
        for launch in layers:
            launch.cores = groups
        assert decode(engine, prompt, 4).tobytes() == five.tobytes(), f"{groups} work-groups"


def test_only_a_one_token_step_that_samples_takes_them(tmp_path: Path, monkeypatch) -> None:
    path = write_tiny_gguf(tmp_path / "m.gguf", arch="llama", weight_type=Q.Q4_1, **SHAPE)
    engine = engine_for(path, monkeypatch, "1")
    launched: list[int] = []
    enqueue = CPULayer.enqueue
    monkeypatch.setattr(CPULayer, "enqueue", lambda self, queue, t: launched.append(t) or enqueue(self, queue, t))

    def launches(batch: list[Work]) -> int:
        launched.clear()
        engine.step(batch)
        return len(launched)

    assert launches([Work(turn=0, tokens=[5, 6, 7], start=0, block_table=[0], sample=True)]) == 0
    assert launches([Work(turn=0, tokens=[8], start=3, block_table=[0], sample=False)]) == 0  # (to the K/V only)
    assert launches([Work(turn=0, tokens=[9], start=4, block_table=[0], sample=True)]) == SHAPE["n_layers"]
    two = [Work(turn=0, tokens=[9], start=5, block_table=[0], sample=True), Work(turn=1, tokens=[9], start=0, block_table=[1], sample=True)]
    assert launches(two) == 0


@pytest.mark.parametrize(
    "arch, weight_type",
    [("gemma3", Q.Q4_1), ("qwen3", Q.Q4_1), ("llama", Q.Q2_K), ("llama", Q.F16)],
    ids=["post-norms", "QK-norm", "Q2_K", "F16"],
)
def test_layers_decode_layer_cannot_take_keep_their_launches(tmp_path: Path, arch: str, weight_type) -> None:
    """(Read from the uploaded weights, as the family does before it makes the launches:
    an engine here would build kernels it never runs.)"""
    model = load_model(write_tiny_gguf(tmp_path / "m.gguf", arch=arch, weight_type=weight_type, **SHAPE))
    device = select_device()
    family = CPUFamily(device)
    assert not layer_launch_fits(family_weights(family, device, model))
    fitting = load_model(write_tiny_gguf(tmp_path / "fits.gguf", arch="llama", weight_type=Q.Q4_1, **SHAPE))
    assert layer_launch_fits(family_weights(family, device, fitting))


def test_a_profiled_engine_or_the_setting_keeps_five_launches(tmp_path: Path, monkeypatch) -> None:
    """A profile times each matmul; SLOTSWARM_LAYER_LAUNCH=0 turns the layer launch off."""
    path = write_tiny_gguf(tmp_path / "m.gguf", arch="llama", weight_type=Q.Q4_1, **SHAPE)
    assert engine_for(path, monkeypatch, "1").launches.one_token is not None
    assert engine_for(path, monkeypatch, "0").launches.one_token is None
    monkeypatch.setenv("SLOTSWARM_LAYER_LAUNCH", "1")
    assert OpenCLEngine(load_model(path), num_blocks=8, kernels="cpu", profile=True).launches.one_token is None
