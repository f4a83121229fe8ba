"""Engine micro-benchmark: what one decode step costs on this device.

Decode reads every weight once per step, so the floor of a step is
weight bytes / memory bandwidth; the report puts the measured step next to it,
and the step cost law (runtime.cost) fitted to the calibration and every step
timed here.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from gpu.engine import OpenCLEngine
from runtime.cost import step_features
from runtime.engine import Work

BATCHES = (1, 2, 4, 8)
PROMPT = 64  # positions each turn holds before the decode steps
PREFILL = 256  # tokens in the timed prefill chunk


def _span(steps: int, block_size: int) -> int:
    """KV blocks one bench turn needs."""
    return -(-max(PROMPT + (steps + 1) * len(BATCHES), PREFILL) // block_size)


def kv_blocks_needed(steps: int, block_size: int = 16) -> int:
    return (max(BATCHES) + 1) * _span(steps, block_size)


def run_engine_bench(engine: OpenCLEngine, steps: int = 16) -> dict:
    """Time decode steps of 1, 2, 4 and 8 live turns and one prefill chunk."""
    vocab = engine.config.vocab_size
    rng = np.random.default_rng(0)
    span = _span(steps, engine.block_size)
    tables = [list(range(i * span, (i + 1) * span)) for i in range(max(BATCHES) + 1)]
    if kv_blocks_needed(steps, engine.block_size) > engine.num_blocks:
        raise ValueError(f"the bench needs {len(tables) * span} KV blocks, the engine has {engine.num_blocks}")

    engine.calibrate()
    cost = engine.cost
    # prefill: one chunk of PREFILL tokens (after a warm-up step that compiles and touches memory)
    chunk = rng.integers(0, vocab, PREFILL).tolist()
    prefill = Work(turn=99, tokens=chunk, start=0, block_table=tables[-1], sample=True)
    engine.step([prefill])
    t0 = time.perf_counter()
    engine.step([prefill])
    prefill_s = time.perf_counter() - t0
    cost.observe(*step_features([prefill]), prefill_s)

    for turn in range(max(BATCHES)):
        engine.step([Work(turn=turn, tokens=rng.integers(0, vocab, PROMPT).tolist(), start=0, block_table=tables[turn], sample=False)])
    position = PROMPT
    results = []
    for batch in BATCHES:
        times = []
        for _ in range(steps + 1):
            work = [Work(turn=t, tokens=[1 + t], start=position, block_table=tables[t], sample=True) for t in range(batch)]
            t0 = time.perf_counter()
            engine.step(work)
            times.append(time.perf_counter() - t0)
            cost.observe(*step_features(work), times[-1])
            position += 1
        results.append({"batch": batch, "step_ms": 1e3 * statistics.median(times[1:])})

    weight_bytes = engine.weights.bytes_per_step()
    copy = engine.device.copy_bandwidth()
    step1 = results[0]["step_ms"] / 1e3
    return {
        "device": engine.device_name,
        "steps": results,
        "prefill_tok_per_s": PREFILL / prefill_s,
        "decode_tok_per_s": BATCHES[-1] / (results[-1]["step_ms"] / 1e3),
        "weight_bytes_per_step": weight_bytes,
        "copy_gb_s": copy / 1e9,
        "achieved_gb_s": weight_bytes / step1 / 1e9,
        "floor_ms": 1e3 * weight_bytes / copy,
        "step_cost": _refit(cost),
    }


def _refit(cost) -> dict:
    cost.refit()
    return {**cost.coefficients, "calibration_steps": len(cost.anchors), "observed_steps": cost.observed}


def format_report(r: dict) -> str:
    lines = [f"device: {r['device']}"]
    for s in r["steps"]:
        lines.append(f"  decode step, {s['batch']} turn(s): {s['step_ms']:7.2f} ms  ({s['batch'] / s['step_ms'] * 1e3:6.1f} tok/s)")
    lines += [
        f"prefill: {r['prefill_tok_per_s']:.0f} tok/s ({PREFILL}-token chunk)",
        f"decode, {r['steps'][-1]['batch']} turns: {r['decode_tok_per_s']:.1f} tok/s aggregate",
        f"weights read per step: {r['weight_bytes_per_step'] / 1e6:.1f} MB",
        f"copy bandwidth: {r['copy_gb_s']:.1f} GB/s (bytes read + written by a 256 MiB buffer copy)",
        f"memory floor of a step: {r['floor_ms']:.2f} ms (weight bytes / copy bandwidth)",
        f"achieved at batch 1: {r['achieved_gb_s']:.2f} GB/s of weights",
    ]
    c = r["step_cost"]
    lines.append(
        f"step cost law: {c['fixed_s'] * 1e3:.2f} ms + {c['token_s'] * 1e3:.3f} ms/token + {c['kv_s'] * 1e9:.2f} ns/KV position read"
        f"  (fitted on {c['calibration_steps']} calibration + {c['observed_steps']} measured steps)"
    )
    return "\n".join(lines)
