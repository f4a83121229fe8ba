"""The OpenCL engine against the NumPy reference on the tiny random model: prefill,
decode, batches of turns at different positions, mixed prefill + decode steps,
steps longer than the engine's buffers, pause/resume, swap out/in, bad input.
Every test runs on both kernel families (the GPU family runs on PoCL too).

Tolerance: the engine keeps K/V in half precision (11-bit mantissa, relative
rounding error <= 2^-11 ~ 4.9e-4 per element) and computes in float32; the
reference is float32 throughout. Logits must agree to a relative L2 error of
TOL = 2e-3, four times one f16 rounding: loose enough for f16 K/V, tight enough
that any real bug (a wrong position, head or block) fails by orders of magnitude.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import ReferenceModel

from gpu.engine import OpenCLEngine
from gpu.families import GPUTuning
from gpu.model.load import Model
from runtime.scheduling.work import GREEDY, Sampling, Work

TOL = 2e-3  # see the module docstring
BLOCKS_PER_TURN = 8  # 128 positions


def rel_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def table(turn: int) -> list[int]:
    """Turn i owns a fixed, deliberately non-contiguous set of blocks."""
    return [(turn + 7 * j) % 64 for j in range(BLOCKS_PER_TURN)]


@pytest.fixture(scope="module")
def reference(tiny_model: Model) -> ReferenceModel:
    return ReferenceModel(tiny_model)


def prompt(seed: int, n: int, vocab: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


# ------------------------------------------------------------- accuracy


@pytest.mark.parametrize("n", [1, 5, 16, 37])
def test_prefill_logits_match_reference(engine: OpenCLEngine, reference: ReferenceModel, n: int) -> None:
    tokens = prompt(n, n, engine.config.vocab_size)
    want = reference.forward(tokens, 0, reference.new_cache())[-1]
    got = engine.step_logits([Work(turn=0, tokens=tokens, start=0, block_table=table(0), sample=True)])
    assert got.shape == (1, engine.config.vocab_size)
    assert rel_error(got[0], want) < TOL


def test_decode_logits_match_reference_at_many_positions(engine: OpenCLEngine, reference: ReferenceModel) -> None:
    tokens = prompt(1, 9, engine.config.vocab_size)
    cache = reference.new_cache()
    want = reference.forward(tokens, 0, cache)[-1]
    got = engine.step_logits([Work(turn=0, tokens=tokens, start=0, block_table=table(0), sample=True)])[0]
    for position in range(9, 40):  # crosses block boundaries at 16 and 32
        token = int(np.argmax(want))
        assert rel_error(got, want) < TOL
        want = reference.forward([token], position, cache)[-1]
        got = engine.step_logits([Work(turn=0, tokens=[token], start=position, block_table=table(0), sample=True)])[0]
    assert rel_error(got, want) < TOL


def test_positions_past_the_rope_table_match_reference(
    tiny_model: Model, reference: ReferenceModel, kernels: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RoPE reads its angles from a table for the first positions (gpu/weights.py) and computes
    them after: a prompt and decodes across the table's end agree with the reference."""
    import gpu.weights

    monkeypatch.setattr(gpu.weights, "ROPE_TABLE_POSITIONS", 12)
    engine = OpenCLEngine(tiny_model, num_blocks=64, block_size=16, kernels=kernels)
    assert engine.weights.rope_positions == 12
    tokens = prompt(2, 9, engine.config.vocab_size)
    cache = reference.new_cache()
    want = reference.forward(tokens, 0, cache)[-1]
    got = engine.step_logits([Work(turn=0, tokens=tokens, start=0, block_table=table(0), sample=True)])[0]
    for position in range(9, 20):
        assert rel_error(got, want) < TOL
        token = int(np.argmax(want))
        want = reference.forward([token], position, cache)[-1]
        got = engine.step_logits([Work(turn=0, tokens=[token], start=position, block_table=table(0), sample=True)])[0]
    assert rel_error(got, want) < TOL


@pytest.mark.parametrize("batch", [2, 3, 8])
def test_batch_of_turns_at_different_positions(engine: OpenCLEngine, reference: ReferenceModel, batch: int) -> None:
    vocab = engine.config.vocab_size
    prompts = [prompt(100 + i, 3 + 5 * i, vocab) for i in range(batch)]
    caches = [reference.new_cache() for _ in range(batch)]
    want = [reference.forward(p, 0, c)[-1] for p, c in zip(prompts, caches, strict=False)]
    # prefill every turn in ONE step, then decode them together
    got = engine.step_logits([Work(turn=i, tokens=p, start=0, block_table=table(i), sample=True) for i, p in enumerate(prompts)])
    positions = [len(p) for p in prompts]
    for _ in range(4):
        for i in range(batch):
            assert rel_error(got[i], want[i]) < TOL
        nxt = [int(np.argmax(w)) for w in want]
        want = [reference.forward([t], pos, c)[-1] for t, pos, c in zip(nxt, positions, caches, strict=False)]
        got = engine.step_logits(
            [
                Work(turn=i, tokens=[t], start=pos, block_table=table(i), sample=True)
                for i, (t, pos) in enumerate(zip(nxt, positions, strict=False))
            ]
        )
        positions = [p + 1 for p in positions]
    for i in range(batch):
        assert rel_error(got[i], want[i]) < TOL


def test_mixed_prefill_and_decode_step(engine: OpenCLEngine, reference: ReferenceModel) -> None:
    vocab = engine.config.vocab_size
    a, b, c = prompt(7, 12, vocab), prompt(8, 30, vocab), prompt(9, 20, vocab)
    ra, rb, rc = (reference.new_cache() for _ in range(3))
    engine.step([Work(turn=0, tokens=a, start=0, block_table=table(0), sample=False)])
    reference.forward(a, 0, ra)
    engine.step([Work(turn=1, tokens=b[:17], start=0, block_table=table(1), sample=False)])
    reference.forward(b[:17], 0, rb)
    # one step: turn 0 decodes, turn 1 prefills its last chunk and samples,
    # turn 2 prefills a first chunk without sampling
    got = engine.step_logits(
        [
            Work(turn=2, tokens=c[:11], start=0, block_table=table(2), sample=False),
            Work(turn=0, tokens=[5], start=12, block_table=table(0), sample=True),
            Work(turn=1, tokens=b[17:], start=17, block_table=table(1), sample=True),
        ]
    )
    assert got.shape == (2, vocab)
    assert rel_error(got[0], reference.forward([5], 12, ra)[-1]) < TOL
    assert rel_error(got[1], reference.forward(b[17:], 17, rb)[-1]) < TOL
    reference.forward(c[:11], 0, rc)
    got = engine.step_logits([Work(turn=2, tokens=c[11:], start=11, block_table=table(2), sample=True)])
    assert rel_error(got[0], reference.forward(c[11:], 11, rc)[-1]) < TOL


def test_step_longer_than_the_buffers_runs_in_pieces(tiny_model: Model, reference: ReferenceModel, kernels: str) -> None:
    small = OpenCLEngine(tiny_model, num_blocks=16, max_batch_tokens=8, kernels=kernels)
    vocab = small.config.vocab_size
    a, b = prompt(11, 13, vocab), prompt(12, 6, vocab)
    got = small.step_logits(
        [
            Work(turn=0, tokens=a, start=0, block_table=[3, 4], sample=True),
            Work(turn=1, tokens=b, start=0, block_table=[9], sample=True),
        ]
    )
    assert rel_error(got[0], reference.forward(a, 0, reference.new_cache())[-1]) < TOL
    assert rel_error(got[1], reference.forward(b, 0, reference.new_cache())[-1]) < TOL


def test_a_step_that_samples_no_row_stops_at_the_last_layer_s_kv(tiny_model: Model, reference: ReferenceModel, kernels: str) -> None:
    profiled = OpenCLEngine(tiny_model, num_blocks=16, kernels=kernels, profile=True)
    layers = profiled.config.n_layers
    a = prompt(13, 20, profiled.config.vocab_size)
    profiled.step([Work(turn=0, tokens=a[:12], start=0, block_table=[3, 4], sample=False)])
    names = [name for name, _, _ in profiled.last_profile]
    assert names.count("attention") == layers - 1
    assert names[-1] in ("qkv", "qk_norm")  # (the last layer's K/V store)
    got = profiled.step_logits([Work(turn=0, tokens=a[12:], start=12, block_table=[3, 4], sample=True)])
    assert [name for name, _, _ in profiled.last_profile].count("attention") == layers
    assert rel_error(got[0], reference.forward(a, 0, reference.new_cache())[-1]) < TOL


def test_greedy_step_returns_reference_tokens_and_none_without_sample(engine: OpenCLEngine, reference: ReferenceModel) -> None:
    tokens = prompt(3, 10, engine.config.vocab_size)
    want = reference.generate(tokens, 12)
    got = engine.step(
        [
            Work(turn=0, tokens=tokens, start=0, block_table=table(0), sample=True),
            Work(turn=1, tokens=tokens[:4], start=0, block_table=table(1), sample=False),
        ]
    )
    assert got[1] is None
    out = [got[0]]
    while len(out) < len(want):
        out.append(engine.step([Work(turn=0, tokens=[out[-1]], start=len(tokens) + len(out) - 1, block_table=table(0), sample=True)])[0])
    assert out == want


# ------------------------------------------------------------- pause, resume, swap


def run_schedule(engine: OpenCLEngine, prompts: list[list[int]], samplings: list[Sampling], n_new: int,
                 active: list[set[int]]) -> list[list[int]]:  # fmt: skip
    """Drive turns through steps (prefill as one chunk, then decodes). The steps follow
    `active`, pausing the turns not in the current set, with a step for everyone after
    each pass so that every turn finishes."""
    cycle = [*active, set(range(len(prompts)))]
    out: list[list[int]] = [[] for _ in prompts]
    pos = [0] * len(prompts)
    s = 0
    while any(len(o) < n_new for o in out):
        live = [i for i in range(len(prompts)) if len(out[i]) < n_new and (i in cycle[s % len(cycle)])]
        s += 1
        if not live:
            continue
        batch = []
        for i in live:
            tokens = prompts[i] if pos[i] == 0 else [out[i][-1]]
            batch.append(Work(turn=i, tokens=tokens, start=pos[i], block_table=table(i), sample=True, sampling=samplings[i]))
        for i, w, token in zip(live, batch, engine.step(batch), strict=False):
            pos[i] = w.start + len(w.tokens)
            out[i].append(token)
    return out


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    schedule=st.lists(st.sets(st.integers(0, 3), min_size=1), min_size=1, max_size=12),
    seed=st.integers(0, 2**31),
)
def test_paused_turn_produces_exactly_what_it_produces_unpaused(
    engine: OpenCLEngine, kernels: str, schedule: list[set[int]], seed: int
) -> None:
    vocab = engine.config.vocab_size
    prompts = [prompt(seed + i, 4 + 3 * i, vocab) for i in range(4)]
    samplings = [GREEDY, Sampling(temperature=0.9, top_p=0.9, seed=seed), GREEDY, Sampling(temperature=1.2, seed=seed + 1)]
    alone = [run_schedule(engine, [p], [s], 10, [{0}])[0] for p, s in zip(prompts, samplings, strict=False)]
    together = run_schedule(engine, prompts, samplings, 10, schedule)
    assert together == alone


def test_swap_out_and_in_continues_identically(engine: OpenCLEngine) -> None:
    vocab = engine.config.vocab_size
    tokens = prompt(21, 25, vocab)
    old, new = table(5), table(6)

    def continue_from(block_table: list[int], first: int, n: int) -> list[int]:
        out = [first]
        for k in range(n):
            out.append(engine.step([Work(turn=5, tokens=[out[-1]], start=25 + k, block_table=block_table, sample=True)])[0])
        return out

    first = engine.step([Work(turn=5, tokens=tokens, start=0, block_table=old, sample=True)])[0]
    engine.swap_out(5, old, 25)
    want = continue_from(old, first, 8)  # overwrites positions 25.. of the old blocks
    engine.step([Work(turn=6, tokens=prompt(22, 30, vocab), start=0, block_table=old, sample=False)])  # clobber them
    engine.swap_in(5, new)
    assert continue_from(new, first, 8) == want
    with pytest.raises(ValueError, match="no swapped-out KV"):
        engine.swap_in(5, new)  # the host copy is gone
    engine.forget(5)  # idempotent


def test_forget_drops_the_host_copy(engine: OpenCLEngine) -> None:
    engine.step([Work(turn=9, tokens=[1, 2, 3], start=0, block_table=table(9), sample=False)])
    engine.swap_out(9, table(9), 3)
    engine.forget(9)
    engine.forget(9)
    with pytest.raises(ValueError, match="no swapped-out KV"):
        engine.swap_in(9, table(9))


def test_device_argmax_takes_the_lowest_index_among_equal_maxima(engine: OpenCLEngine) -> None:
    """The greedy token comes from the device; it must be numpy's argmax of the logits."""
    rows = np.zeros((3, engine.config.vocab_size), np.float32)
    rows[0, [7, 3, 200]] = 5.0  # a tie: 3 wins
    rows[1, -1] = 1.0
    rows[2] = -np.arange(engine.config.vocab_size, dtype=np.float32)  # all negative: 0 wins
    import pyopencl as cl

    q = engine.device.queue
    cl.enqueue_copy(q, engine.buffers.logits, rows)
    engine.launches.argmax.enqueue(q, 3)
    ids = np.empty(3, np.int32)
    cl.enqueue_copy(q, ids, engine.buffers.ids)
    assert ids.tolist() == [3, engine.config.vocab_size - 1, 0] == np.argmax(rows, axis=1).tolist()


@pytest.mark.parametrize("n", [16, 37, 300])
def test_cpu_argmax_lanes_on_rows_of_any_length(n: int) -> None:
    """The CPU family's argmax scans 16 lanes where a row starts 64-byte aligned, one
    logit at a time where it does not, and a row's tail past the lanes on its own; each
    way it is numpy's argmax, ties (many here) to the lowest index."""
    import pyopencl as cl

    from gpu.device import select_device
    from kernels import source

    device = select_device()
    program = device.build(source("quant") + source("cpu/argmax"))
    rows = np.random.default_rng(n).integers(-3, 3, (5, n)).astype(np.float32)
    rows[0, -1] = 9.0  # in the tail of the aligned first row where n % 16 != 0
    rows[2] = -np.inf  # no maximum above -inf: 0
    flags = cl.mem_flags
    logits = cl.Buffer(device.context, flags.READ_ONLY | flags.COPY_HOST_PTR, hostbuf=rows)
    out = cl.Buffer(device.context, flags.WRITE_ONLY, 4 * len(rows))
    program.argmax_lanes(device.queue, (len(rows),), (1,), logits, np.int32(n), out)
    ids = np.empty(len(rows), np.int32)
    cl.enqueue_copy(device.queue, ids, out)
    assert ids.tolist() == np.argmax(rows, axis=1).tolist()


@pytest.mark.parametrize("span", [3, 16, 23])
def test_gpu_attention_split_over_work_groups_matches_the_reference(tiny_model: Model, reference: ReferenceModel, span: int) -> None:
    """Flash-decoding: each token's positions cut into splits of `span` and combined
    by the last one done; early tokens need fewer splits than the step launches, and
    at span 3 the 50th position needs 17, past MAX_SPLITS, so the span doubles."""
    split = OpenCLEngine(tiny_model, num_blocks=64, kernels="gpu", gpu_tuning=GPUTuning(span=span))
    vocab = split.config.vocab_size
    tokens = prompt(span, 45, vocab)
    cache = reference.new_cache()
    want = reference.forward(tokens, 0, cache)[-1]
    got = split.step_logits([Work(turn=0, tokens=tokens, start=0, block_table=table(0), sample=True)])[0]
    assert rel_error(got, want) < TOL
    for position in range(45, 50):  # decodes, twice over: the counters were reset
        token = int(np.argmax(want))
        want = reference.forward([token], position, cache)[-1]
        got = split.step_logits([Work(turn=0, tokens=[token], start=position, block_table=table(0), sample=True)])[0]
        assert rel_error(got, want) < TOL
