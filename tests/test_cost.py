"""The step cost law (runtime.scheduling.cost) and the step shaping it drives (runtime.scheduling.shaping)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from runtime.scheduling.blocks import BlockPool
from runtime.scheduling.cost import StepCost, fit, kv_reads, step_features
from runtime.scheduling.priority import BACKGROUND, FOREGROUND
from runtime.scheduling.scheduler import Scheduler
from runtime.scheduling.timing import TimingEngine, TimingModel
from runtime.scheduling.turns import SchedulerConfig
from runtime.scheduling.work import Work

CPU = (0.009, 0.0018, 1e-6)  # about what SmolLM2-135M costs on the 2-core CPU
GPU = (0.025, 0.0002, 4e-8)  # an 8B model on a GPU: a batch costs about one turn


def law(fixed, token, kv):
    return lambda tokens, reads: fixed + token * tokens + kv * reads


def random_steps(rng, n):
    """Shapes like a swarm's: 1-8 decodes at various contexts, some prefill chunks."""
    shapes = []
    for _ in range(n):
        if rng.random() < 0.2:
            chunk, start = int(rng.integers(8, 256)), int(rng.integers(0, 512))
            shapes.append((chunk, kv_reads(start, chunk)))
        else:
            batch = int(rng.integers(1, 9))
            shapes.append((batch, sum(int(rng.integers(16, 1024)) for _ in range(batch))))
    return shapes


@pytest.mark.parametrize("coefficients", [CPU, GPU])
def test_the_online_fit_recovers_a_synthetic_law_within_ten_percent(coefficients):
    rng = np.random.default_rng(1)
    truth = law(*coefficients)
    cost = StepCost()  # a wrong prior: the measurements must win
    noisy = lambda t, k: truth(t, k) * rng.uniform(0.95, 1.05)  # noqa: E731
    cost.calibrate([(t, k, noisy(t, k)) for t, k in random_steps(rng, 10)])
    for t, k in random_steps(rng, 600):
        cost.observe(t, k, noisy(t, k))
    for t, k in random_steps(np.random.default_rng(2), 200):
        assert cost.predict(t, k) == pytest.approx(truth(t, k), rel=0.10)


def test_small_steps_learn_what_a_tiled_kernel_costs_them():
    # A device that runs one decode with a matrix-vector kernel and pads 2..8 to a
    # tile of 2, 4 or 8 columns: the straight line misprices a second decode.
    def tiled(tokens, reads):
        padded = tokens if tokens == 1 else 2 if tokens == 2 else 4 if tokens <= 4 else 8 if tokens <= 8 else tokens
        return 0.008 + (0.004 if tokens > 1 else 0.0) + 0.0018 * padded + 1e-6 * reads

    rng = np.random.default_rng(3)
    cost = StepCost()
    cost.calibrate([(t, k, tiled(t, k)) for t, k in random_steps(rng, 20)])
    for t, k in random_steps(rng, 600):
        cost.observe(t, k, tiled(t, k) * rng.uniform(0.97, 1.03))
    for batch in range(1, 9):
        reads = 300 * batch
        assert cost.predict(batch, reads) == pytest.approx(tiled(batch, reads), rel=0.05), batch
    # What shaping asks: a second decode beside one costs ~60% more, not the slope's ~15%.
    assert cost.predict(2, 600) / cost.predict(1, 300) == pytest.approx(tiled(2, 600) / tiled(1, 300), rel=0.05)


def test_the_fit_keeps_every_coefficient_non_negative():
    # Steps that get cheaper with more tokens (noise) must not make a token cost negative.
    samples = [(1, 10, 0.012), (8, 80, 0.011), (4, 40, 0.0115)]
    fixed, token, kv = fit(samples)
    assert min(fixed, token, kv) >= 0
    assert fixed == pytest.approx(0.0115, rel=0.1)


def test_a_steady_stream_of_one_shape_does_not_erase_what_calibration_learned():
    cost = StepCost()
    truth = law(*CPU)
    cost.calibrate([(t, k, truth(t, k)) for t, k in [(1, 20), (8, 160), (64, 2080), (1, 800), (8, 6400)]])
    for _ in range(1000):
        cost.observe(8, 2000, truth(8, 2000))
    assert cost.predict(1, 250) == pytest.approx(truth(1, 250), rel=0.05)
    assert cost.predict(128, kv_reads(0, 128)) == pytest.approx(truth(128, kv_reads(0, 128)), rel=0.05)


def test_features_count_tokens_and_the_positions_attention_reads():
    works = [Work(1, [5], 9, [0, 1, 2], True), Work(2, [5, 5, 5], 0, [3], True)]
    assert step_features(works) == (4, 10 + (1 + 2 + 3))


def test_the_timing_engine_prices_steps_by_the_same_law_and_never_learns():
    model = TimingModel.cpu()
    engine = TimingEngine(model)
    before = engine.cost.coefficients
    engine.cost.observe(8, 100, 123.0)
    engine.cost.refit()
    assert engine.cost.coefficients == before
    assert engine.cost.predict(1, 0) == pytest.approx(model.decode_step_s, rel=1e-3)


# ---------------------------------------------------------------- shaping


class Rig:
    def __init__(self, coefficients, slots=8, **config):
        self.sched = Scheduler(SchedulerConfig(slots=slots, step_tokens=16, **config), BlockPool(2000, 16), cost=StepCost(*coefficients))
        self.now = 0.0

    def submit(self, agent, priority, prompt=4, max_tokens=1000):
        # (each agent's own token, so the prefix cache shares nothing between them)
        token = 100 + zlib.crc32(agent.encode()) % 100_000
        return self.sched.submit(agent, priority, [token] * prompt, max_tokens, self.now, ignore_eos=True)

    def step(self):
        plan = self.sched.schedule(self.now)
        self.now += 0.01
        self.sched.postprocess(plan, [7 if w.sample else None for w in plan.works], self.now)
        return plan


def busy(rig, n=7):
    bg = [rig.submit(f"bg{i}", BACKGROUND) for i in range(n)]
    for _ in range(3):
        rig.step()
    return bg


def test_on_a_cpu_background_decodes_are_thinned_to_the_slack_and_take_turns():
    rig = Rig(CPU)
    bg = busy(rig)
    fg = rig.submit("fg", FOREGROUND, prompt=300)
    first = rig.step()
    assert [len(w.tokens) for w in first.works][0] == 300  # the whole prompt in one chunk
    served = set()
    for _ in range(20):
        plan = rig.step()
        assert plan.works[0].turn == fg.id
        ours, others = plan.works[:1], plan.works[1:]
        assert 0 < len(others) < 7  # thinned, not stopped
        assert rig.sched.cost.predict_works(plan.works) <= 1.25 * rig.sched.cost.predict_works(ours)
        served |= {w.turn for w in others}
    assert served == {t.id for t in bg}  # round robin: nobody starves


def test_on_a_gpu_background_decodes_keep_full_speed():
    rig = Rig(GPU)
    busy(rig)
    rig.submit("fg", FOREGROUND, prompt=30)
    rig.step()
    for _ in range(5):
        assert len(rig.step().works) == 8


def test_background_prefill_fits_in_what_the_slack_leaves_and_is_whole_again_after():
    rig = Rig(CPU, slots=3)
    busy(rig, 1)
    fg = rig.submit("fg", FOREGROUND, prompt=10, max_tokens=30)
    late = rig.submit("late", BACKGROUND, prompt=40)
    chunks = []
    while not fg.done:
        plan = rig.step()
        chunks += [len(w.tokens) for w in plan.works if w.turn == late.id]
        ours = [w for w in plan.works if w.turn == fg.id]
        assert rig.sched.cost.predict_works(plan.works) <= 1.25 * rig.sched.cost.predict_works(ours)
    assert chunks and max(chunks) < 16  # it crept forward, never starved


def test_no_shaping_and_zero_slack_are_honoured():
    off = Rig(CPU, shaping=False)
    busy(off)
    off.submit("fg", FOREGROUND, prompt=4)
    off.step()
    assert len(off.step().works) == 8
    tight = Rig(GPU, slack=0.0)
    busy(tight)
    tight.submit("fg", FOREGROUND, prompt=4)
    tight.step()
    assert len(tight.step().works) == 1


def test_a_refit_weighs_the_last_window_of_steps_and_the_anchors_only():
    # 20 steps through a window of 8: the law is the fit of the last 8 (oldest
    # first, as they came) with the anchors at a quarter of a window's weight.
    rng = np.random.default_rng(4)
    anchors = [(t, k, law(*CPU)(t, k)) for t, k in random_steps(rng, 5)]
    steps = [(t, k, law(*CPU)(t, k) * rng.uniform(0.8, 1.2)) for t, k in random_steps(rng, 20)]
    cost = StepCost(window=8, refit_every=1, refit_seconds=0.0)
    cost.calibrate(anchors)
    for step in steps:
        cost.observe(*step)
    assert (cost.fixed_s, cost.token_s, cost.kv_s) == fit(steps[-8:] + anchors, [1.0] * 8 + [max(1.0, 0.25 * 8 / 5)] * 5)


def test_a_refit_waits_for_enough_steps_and_enough_measured_time():
    # A refit costs host time: on a fast device it waits until the steps it
    # learns from add up to `refit_seconds`, as well as `refit_every` of them.
    # (A step size gets its factor, runtime.scheduling.cost.shape_rows, at a refit.)
    cost = StepCost(0.001, refit_every=4, refit_seconds=0.010)
    for _ in range(9):  # 9 ms in all: under the 10 ms a refit waits for
        cost.observe(1, 10, 0.001)
    assert cost.shape == {}
    cost.observe(1, 10, 0.002)
    assert set(cost.shape) == {1}
    for _ in range(3):  # slow steps: now it waits for the step count
        cost.observe(2, 20, 0.050)
    assert set(cost.shape) == {1}
    cost.observe(2, 20, 0.050)
    assert set(cost.shape) == {1, 2}


def test_an_idle_turn_computes_only_the_prompt_its_prefix_cache_did_not_give():
    law = StepCost(fixed_s=0.01, token_s=0.001, kv_s=1e-6)
    cold_ttft, itl, cold_turn = law.idle_turn(1000, 10, chunk=256)
    warm_ttft, warm_itl, warm_turn = law.idle_turn(1000, 10, chunk=256, cached=900)
    # 100 positions from 900 on, in one chunk; the decodes are the same.
    assert warm_ttft == pytest.approx(law.predict(100, kv_reads(900, 100)))
    assert warm_ttft < cold_ttft and warm_itl == itl and cold_turn - warm_turn == pytest.approx(cold_ttft - warm_ttft)
    # All of it cached: its last position is still computed, to sample from.
    assert law.idle_turn(1000, 10, chunk=256, cached=1000)[0] == pytest.approx(law.predict(1, kv_reads(999, 1)))
