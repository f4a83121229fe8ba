"""Batch invariance of the GPU family: a turn's logits are the same bits whoever
shares its steps, however many they are, however its prompt is chunked and
wherever its blocks lie. Preemption pauses a turn and resumes it among other
turns, so this is what makes a paused turn produce exactly what it would have
produced alone (test_engine.py checks the tokens on whole schedules, on both
families). The CPU family's tokens agree too, but not always its last bits: its
integer matmuls (4-, 5-, 6- and 8-bit blocks) add a column in one order at every tile
width (tests/test_nibbles.py), its float ones (q8x2, f32) round differently at 1-2
columns and at 4-8.

The GPU family's ways to break it, each exercised here: the matmul takes `mv`
for a step of up to 16 tokens and the tiled `mm` for more; attention splits a
token's positions over work-groups (a small span here, so a long batch-mate
needs many more splits than the turn); and a unit's lanes are added across a
subgroup or through local memory (gpu/subgroups.py)."""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pytest
from reference import ReferenceModel

from gpu import subgroups
from gpu.engine import OpenCLEngine
from gpu.families import GPUTuning
from gpu.model.load import Model, load_model
from gpu.model.synthetic import write_tiny_gguf
from runtime.errors import ConfigError
from runtime.scheduling.work import Work

SPAN = 16  # positions per attention split: a 70-position mate needs 5, the turn 1


def table(turn: int) -> list[int]:
    """Turn i's blocks: 8 of 64, disjoint for turns 0..6."""
    return [(turn + 7 * j) % 64 for j in range(8)]


def prompt(seed: int, n: int, vocab: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


@pytest.fixture(scope="module")
def engine(tiny_model: Model) -> OpenCLEngine:
    return OpenCLEngine(tiny_model, num_blocks=64, kernels="gpu", gpu_tuning=GPUTuning(span=SPAN))


def step(engine: OpenCLEngine, works: list[Work], turn: int) -> np.ndarray:
    """The step's logits for `turn` (every work samples)."""
    logits = engine.step_logits(works)
    return logits[[w.turn for w in works].index(turn)]


def test_a_turn_among_others_gives_the_bits_it_gives_alone(engine: OpenCLEngine) -> None:
    vocab = engine.config.vocab_size
    tokens = prompt(1, 10, vocab)
    alone = [step(engine, [Work(turn=0, tokens=tokens, start=0, block_table=table(0), sample=True)], 0)]
    fed = []
    for k in range(6):
        fed.append(int(np.argmax(alone[-1])))
        alone.append(step(engine, [Work(turn=0, tokens=[fed[-1]], start=10 + k, block_table=table(0), sample=True)], 0))

    # The same turn as turn 1, in other blocks, with its prompt in two chunks: the
    # first among two long prefills (mm), the second beside a 70-token prefill whose
    # attention takes 5 splits, then decodes at batch 5 and at batch 2.
    mates = {t: prompt(10 + t, n, vocab) for t, n in ((2, 30), (3, 20), (4, 70), (5, 3))}
    works = lambda *ws: [Work(turn=t, tokens=tk, start=s, block_table=table(t), sample=True) for t, tk, s in ws]  # noqa: E731
    step(engine, works((2, mates[2], 0), (1, tokens[:4], 0), (3, mates[3], 0)), 1)
    together = [step(engine, works((4, mates[4], 0), (1, tokens[4:], 4), (2, [7], 30)), 1)]
    for k, token in enumerate(fed):
        if k < 3:
            batch = works((2, [k + 1], 31 + k), (3, [k], 20 + k), (1, [token], 10 + k), (4, [k], 70 + k),
                          (5, mates[5], 0) if k == 0 else (5, [k], 2 + k))  # fmt: skip
        else:
            batch = works((1, [token], 10 + k), (4, [k], 70 + k))
        together.append(step(engine, batch, 1))
    for k, (a, b) in enumerate(zip(alone, together, strict=False)):
        assert np.array_equal(a, b), f"step {k}: the turn's logits changed with its batch (max diff {np.abs(a - b).max():.3g})"


@pytest.fixture(scope="module")
def odd_model(tmp_path_factory: pytest.TempPathFactory) -> Model:
    """Rows of 3 blocks (d_model 96: two lanes, one with two blocks) and of 33 (d_ff 1056:
    32 lanes, the first with two): the lane orders mv and mm must agree on."""
    path = write_tiny_gguf(tmp_path_factory.mktemp("odd") / "odd.gguf", d_model=96, head_dim=32, d_ff=1056, n_layers=2)
    return load_model(path)


def prefill_then_decode(engine: OpenCLEngine, tokens: list[int], chunk: int, decodes: int) -> list[np.ndarray]:
    """Logits after the prompt (fed `chunk` tokens a step) and after each greedy decode."""
    for c0 in range(0, len(tokens) - chunk, chunk):
        engine.step_logits([Work(turn=0, tokens=tokens[c0 : c0 + chunk], start=c0, block_table=table(0), sample=True)])
    c0 = (len(tokens) - 1) // chunk * chunk
    out = [engine.step_logits([Work(turn=0, tokens=tokens[c0:], start=c0, block_table=table(0), sample=True)])[0]]
    for k in range(decodes):
        work = Work(turn=0, tokens=[int(np.argmax(out[-1]))], start=len(tokens) + k, block_table=table(0), sample=True)
        out.append(engine.step_logits([work])[0])
    return out


def test_lane_sums_agree_between_kernels_and_paths(odd_model: Model) -> None:
    """A 40-token prompt as one step (mm) or in chunks of 8 (mv) gives the same bits,
    with the lanes added through local memory or by the subgroup butterfly (emulated
    here: PoCL's CPU device has no subgroups); and the logits match the reference."""
    tokens = prompt(3, 40, odd_model.config.vocab_size)
    runs = []
    for mode in ("local", "emulated"):
        engine = OpenCLEngine(odd_model, num_blocks=64, kernels="gpu", gpu_tuning=GPUTuning(subgroups=mode))
        assert engine.family.subgroups == mode
        runs += [prefill_then_decode(engine, tokens, 40, 3), prefill_then_decode(engine, tokens, 8, 3)]
    for run in runs[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(runs[0], run, strict=False))
    reference = ReferenceModel(odd_model)
    want = reference.forward(tokens, 0, reference.new_cache())[-1]
    assert np.linalg.norm(runs[0][0] - want) / np.linalg.norm(want) < 2e-3


def test_subgroup_choice_follows_the_device() -> None:
    shuffles = "cl_khr_fp64 cl_khr_subgroups cl_khr_subgroup_shuffle"
    assert subgroups.choose(shuffles, "OpenCL C 3.0 ") == "khr"
    assert subgroups.build_options("khr", "OpenCL C 3.0 ") == ["-DSUBGROUPS=1", "-cl-std=CL3.0"]
    assert subgroups.build_options("khr", "OpenCL C 2.0 ") == ["-DSUBGROUPS=1", "-cl-std=CL2.0"]
    assert subgroups.choose(shuffles, "OpenCL C 1.2 ") == "local"  # its headers declare no shuffles
    assert subgroups.choose("cl_khr_subgroups cl_intel_subgroups", "OpenCL C 3.0") == "local"  # no xor shuffle
    assert subgroups.choose("cl_khr_subgroup_shuffle_relative", "OpenCL C 3.0") == "local"
    assert subgroups.choose(shuffles, "OpenCL C 3.0", "local") == "local"
    assert subgroups.build_options("local", "OpenCL C 3.0") == ["-DSUBGROUPS=0"]
    assert subgroups.c_version("garbage") == (1, 0)
    with pytest.raises(ConfigError, match="subgroups must be one of"):
        subgroups.choose("", "OpenCL C 3.0", "warp")


def test_this_device_gets_the_lane_sums_its_extensions_allow(tiny_model: Model) -> None:
    """Whatever the device here is: shuffles if it has them (then the lanes fit in a
    subgroup), else local memory, at most 32 lanes either way."""
    engine = OpenCLEngine(tiny_model, num_blocks=8, kernels="gpu")
    device: cl.Device = engine.device.device
    assert engine.family.subgroups in (subgroups.choose(device.extensions, device.opencl_c_version), "local")
    assert 2 <= engine.family.lanes <= subgroups.MAX_LANES
    assert subgroups.lane_cap("local", [], device, engine.family.wg) == subgroups.MAX_LANES


def test_a_span_below_one_position_is_refused(tiny_model: Model) -> None:
    with pytest.raises(ConfigError, match="span of at least one position"):
        OpenCLEngine(tiny_model, num_blocks=8, kernels="gpu", gpu_tuning=GPUTuning(span=0))
