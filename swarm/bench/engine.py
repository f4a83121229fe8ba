"""Engine micro-benchmark: what one decode step costs on this device.

Decode reads every weight once per step, so the floor of a step is
weight bytes / memory bandwidth; the report puts the measured step next to it,
and the step cost law (runtime.scheduling.cost) fitted to the calibration and every step
timed here.

With `profile=True` (an engine opened with `profile=True`), each batch size also
gets a breakdown from OpenCL profiling events: device time per kernel per step,
its share of the step, GB/s of weights for the kernels that read them, launches
per step, and the time the device sat idle between launches (host gaps).

A prompt is bound by arithmetic, not memory: on the CPU family the report puts the
prefill next to its multiply ceiling, the time its matmuls' integer products would take
at the rate of the multiplies they are built on with nothing else in the loop
(cpu/nibbles.cl's multiply_ceiling, on every core).
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import pyopencl as cl

from gpu.device import Device
from gpu.engine import OpenCLEngine
from gpu.launches import LOWBIT_KINDS, NIBBLE_VARIANTS
from runtime.scheduling.blocks import BlockPool
from runtime.scheduling.cost import step_features
from runtime.scheduling.scheduler import Scheduler
from runtime.scheduling.turns import SchedulerConfig
from runtime.scheduling.units import ceil_div
from runtime.scheduling.work import Work

BATCHES = (1, 2, 4, 8)
PROMPT = 64  # positions each turn holds before the decode steps
PREFILL = 256  # tokens in the timed prefill chunk
TTFT_PROMPT = 1000  # tokens of the prompt whose time to first token is timed, cached and not
LONG = 1000  # positions each turn holds in the long-context decode step
TTFT_REPEATS = 3
PREFILL_REPEATS = 3  # timings of the prefill chunk (a prompt is compute-bound: the most a busy host slows)
CACHED_REPEATS = 5  # timings of each repeated prompt
CEILING_SUMS = 4  # cpu/nibbles.cl's: a multiply_ceiling round's multiply-adds
CEILING_PRODUCTS = {8: 64, 16: 32}  # products of one multiply-add (a 512-bit register), by input width
CEILING_SECONDS = 0.05  # the least a timed multiply_ceiling launch runs
CEILING_ITEMS = 16  # multiply_ceiling's work-items a core


def _span(steps: int, block_size: int) -> int:
    """KV blocks one bench turn needs."""
    return ceil_div(max(PROMPT + (steps + 1) * len(BATCHES), PREFILL), block_size)


def _long_span(steps: int, block_size: int) -> int:
    """KV blocks one turn of the long-context step needs."""
    return ceil_div(LONG + steps + 1, block_size)


def kv_blocks_needed(steps: int, block_size: int = 16) -> int:
    short = (max(BATCHES) + 1) * _span(steps, block_size)  # (the long-context turns reuse these blocks after)
    return max(short, max(BATCHES) * _long_span(steps, block_size), 2 * ceil_div(TTFT_PROMPT, block_size) + 2)


def profile_steps(profiles: list[list[tuple[str, int, object]]], wall_s: list[float]) -> dict:
    """Average one step's kernels over `profiles` (each a step's engine.last_profile)."""
    kernels: dict[str, dict] = {}
    busy = idle = 0.0
    for events in profiles:
        last_end = None
        for name, nbytes, event in events:
            start, end = event.profile.start, event.profile.end
            k = kernels.setdefault(name, {"ms": 0.0, "bytes": 0})
            k["ms"] += (end - start) / 1e6
            k["bytes"] += nbytes
            busy += (end - start) / 1e6
            if last_end is not None:
                idle += max(0, start - last_end) / 1e6
            last_end = end
    n = len(profiles)
    out = {}
    for name, k in sorted(kernels.items(), key=lambda kv: -kv[1]["ms"]):
        ms = k["ms"] / n
        out[name] = {"ms": ms, "share": k["ms"] / busy if busy else 0.0}
        if k["bytes"]:
            out[name]["gb_s"] = k["bytes"] / (k["ms"] / 1e3) / 1e9 if k["ms"] else None
    return {
        "kernels": out,
        "launches": sum(len(e) for e in profiles) / n,
        "device_ms": busy / n,
        "idle_ms": idle / n,
        "wall_ms": 1e3 * statistics.mean(wall_s),
    }


def multiply_ceiling(device: Device, program: cl.Program, cores: int, bits: int, rounds: int = 0) -> tuple[float, np.ndarray]:
    """Integer products a second of the CPU family's multiplies alone, on inputs of `bits`
    (8 or 16): `program`'s multiply_ceiling (cpu/nibbles.cl), CEILING_ITEMS work-items a core
    (PoCL may run a launch of one a core on a single thread), `rounds` each (by default
    enough to run CEILING_SECONDS; the best of three launches); and each work-item's sum of
    its products."""
    queue, items = device.queue, CEILING_ITEMS * cores
    kernel = cl.Kernel(program, "multiply_ceiling")
    out = cl.Buffer(device.context, cl.mem_flags.WRITE_ONLY, 4 * items)
    sums = np.empty(items, np.uint32)

    def launch(n: int) -> float:
        kernel.set_args(np.int32(n), np.int32(bits), out)
        t0 = time.perf_counter()
        cl.enqueue_nd_range_kernel(queue, kernel, (items,), (1,)).wait()
        return time.perf_counter() - t0

    if not rounds:
        rounds = 1 << 8
        while launch(rounds) < CEILING_SECONDS / 2:
            rounds *= 2
    best = min(launch(rounds) for _ in range(3))
    cl.enqueue_copy(queue, sums, out).wait()
    out.release()
    return items * rounds * CEILING_SUMS * CEILING_PRODUCTS[bits] / best, sums


def prompt_products(engine: OpenCLEngine) -> dict[int, int]:
    """A prompt token's integer products in the layers' matmuls, by the width their inputs are
    rounded to (the CPU family's input_bits)."""
    products = {8: 0, 16: 0}
    for L in engine.weights.layers:
        for m in (L.qkv, L.out, L.gate_up, L.down):
            for part in m.parts or [m]:
                if part.kind in NIBBLE_VARIANTS or part.kind in LOWBIT_KINDS:
                    products[engine.family.input_bits(part.kind)] += part.rows * part.cols
    return products


def run_engine_bench(engine: OpenCLEngine, steps: int = 16) -> dict:
    """Time decode steps of 1, 2, 4 and 8 live turns, 8 at LONG positions, and one prefill chunk."""
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
    products = prompt_products(engine) if engine.kernels == "cpu" else {}
    widths = [bits for bits, n in products.items() if n]  # (a model of float matrices has none)
    prefill_times, ceilings, floors = [], [], []
    for _ in range(PREFILL_REPEATS):
        if widths:  # the multiply ceiling just before each chunk, so both see the same machine
            ceilings.append({bits: multiply_ceiling(engine.device, engine.program, engine.family.cores, bits)[0] for bits in widths})
            floors.append(sum(PREFILL * products[bits] / rate for bits, rate in ceilings[-1].items()))
        t0 = time.perf_counter()
        engine.step([prefill])
        prefill_times.append(time.perf_counter() - t0)
        cost.observe(*step_features([prefill]), prefill_times[-1])
    prefill_s = statistics.median(prefill_times)

    for turn in range(max(BATCHES)):
        engine.step([Work(turn=turn, tokens=rng.integers(0, vocab, PROMPT).tolist(), start=0, block_table=tables[turn], sample=False)])
    position = PROMPT
    results = []
    for batch in BATCHES:
        times, profiles = [], []
        for _ in range(steps + 1):
            work = [Work(turn=t, tokens=[1 + t], start=position, block_table=tables[t], sample=True) for t in range(batch)]
            t0 = time.perf_counter()
            engine.step(work)
            times.append(time.perf_counter() - t0)
            cost.observe(*step_features(work), times[-1])
            profiles.append(engine.last_profile)
            position += 1
        results.append({"batch": batch, "step_ms": 1e3 * statistics.median(times[1:])})
        if engine.profile:
            results[-1]["profile"] = profile_steps(profiles[1:], times[1:])

    long = long_context_step(engine, rng, steps)
    ttft_tokens = min(TTFT_PROMPT, engine.config.context_length - 1)
    uncached, cached = time_to_first_token(engine, rng, ttft_tokens)
    weight_bytes = engine.weights.bytes_per_step()
    copy = engine.device.copy_bandwidth()
    step1 = results[0]["step_ms"] / 1e3
    ceiling = {}
    if widths:
        ceiling = {
            "multiply_ceiling": {str(bits): statistics.median(c[bits] for c in ceilings) for bits in widths},
            "prefill_ceiling_share": statistics.median(f / t for f, t in zip(floors, prefill_times, strict=True)),
        }
    return {
        "device": engine.device_name,
        "kernels": engine.kernels,
        "int8": engine.family.int8,  # SLOTSWARM_INT8: 8-bit Q4_K/Q6_K inputs
        "int8_nibbles": engine.family.int8_nibbles,  # SLOTSWARM_INT8=all: and Q4_0/Q4_1's
        "steps": results,
        "long": long,
        "prefill_tok_per_s": PREFILL / prefill_s,
        "decode_tok_per_s": BATCHES[-1] / (results[-1]["step_ms"] / 1e3),
        "weight_bytes_per_step": weight_bytes,
        "copy_gb_s": copy / 1e9,
        "achieved_gb_s": weight_bytes / step1 / 1e9,
        "floor_ms": 1e3 * weight_bytes / copy,
        "step_cost": _refit(cost),
        "ttft_prompt_tokens": ttft_tokens,
        "ttft_uncached_ms": 1e3 * uncached,
        "ttft_cached_ms": 1e3 * cached,
        **ceiling,
    }


def long_context_step(engine: OpenCLEngine, rng: np.random.Generator, steps: int) -> dict:
    """Decode steps of 8 turns holding LONG positions each (fewer if the context is
    shorter), where attention reads the most: one turn's prompt is prefilled and
    the others' K/V blocks are device copies of its (attention's time depends on
    how many positions it reads, not on what they hold)."""
    batch, size = max(BATCHES), engine.block_size
    positions = min(LONG, engine.config.context_length - steps - 2)
    span = _long_span(steps, size)
    tables = [list(range(t * span, (t + 1) * span)) for t in range(batch)]
    prompt = rng.integers(0, engine.config.vocab_size, positions).tolist()
    for c0 in range(0, positions, engine.max_batch_tokens):
        chunk = prompt[c0 : c0 + engine.max_batch_tokens]
        engine.step([Work(turn=0, tokens=chunk, start=c0, block_table=tables[0], sample=False)])
    for t in range(1, batch):
        for source, target in zip(tables[0][: ceil_div(positions, size)], tables[t], strict=False):
            engine.copy(source, target)
    times, profiles = [], []
    for k in range(steps + 1):
        work = [Work(turn=t, tokens=[1 + t], start=positions + k, block_table=tables[t], sample=True) for t in range(batch)]
        t0 = time.perf_counter()
        engine.step(work)
        times.append(time.perf_counter() - t0)
        profiles.append(engine.last_profile)
    out = {"batch": batch, "positions": positions, "step_ms": 1e3 * statistics.median(times[1:])}
    if engine.profile:
        out["profile"] = profile_steps(profiles[1:], times[1:])
    return out


def time_to_first_token(engine: OpenCLEngine, rng: np.random.Generator, tokens: int) -> tuple[float, float]:
    """Median seconds from submit to first token of a new prompt of `tokens` tokens,
    then of the same prompt again (all but its last token now in the prefix cache), each
    driven through the real scheduler in steps of the engine's batch size."""
    sched = Scheduler(SchedulerConfig(slots=1, step_tokens=engine.max_batch_tokens), BlockPool(engine.num_blocks, engine.block_size))
    first = sched.submit("warm-up", 0, rng.integers(0, engine.config.vocab_size, 32).tolist(), 1, 0.0)
    _first_token(engine, sched, first)
    uncached, cached = [], []
    for _ in range(TTFT_REPEATS):  # interleaved, so both see the same machine
        prompt = rng.integers(0, engine.config.vocab_size, tokens).tolist()
        # (a repeat costs about a decode step, so it is timed a few times: one
        # sample of a step on a busy machine says little)
        for times in [uncached] + [cached] * CACHED_REPEATS:
            t0 = time.perf_counter()
            _first_token(engine, sched, sched.submit("bench", 0, prompt, 1, 0.0))
            times.append(time.perf_counter() - t0)
    return statistics.median(uncached), statistics.median(cached)


def _first_token(engine: OpenCLEngine, sched: Scheduler, turn) -> None:
    while not turn.output:
        plan = sched.schedule(0.0)
        for move in plan.moves:  # the prefix cache's block copy
            move.apply(engine)
        sched.postprocess(plan, engine.step(plan.works), 0.0)


def _refit(cost) -> dict:
    cost.refit()
    return {**cost.coefficients, "calibration_steps": len(cost.anchors), "observed_steps": cost.observed}


def format_report(r: dict) -> str:
    int8 = f", Q4_K/Q6_K{'/Q4_0/Q4_1' if r.get('int8_nibbles') else ''} on 8-bit inputs" if r.get("int8") else ""
    lines = [f"device: {r['device']} ({r['kernels']} kernels{int8})"]
    for s in r["steps"]:
        lines.append(f"  decode step, {s['batch']} turn(s): {s['step_ms']:7.2f} ms  ({s['batch'] / s['step_ms'] * 1e3:6.1f} tok/s)")
        if "profile" in s:
            lines += _format_profile(s["profile"])
    long = r["long"]
    lines.append(f"  decode step, {long['batch']} turns at {long['positions']} positions each: {long['step_ms']:7.2f} ms")
    if "profile" in long:
        lines += _format_profile(long["profile"])
    lines += [
        f"prefill: {r['prefill_tok_per_s']:.0f} tok/s ({PREFILL}-token chunk)",
        *_format_ceiling(r),
        f"decode, {r['steps'][-1]['batch']} turns: {r['decode_tok_per_s']:.1f} tok/s aggregate",
        f"weights read per step: {r['weight_bytes_per_step'] / 1e6:.1f} MB",
        f"copy bandwidth: {r['copy_gb_s']:.1f} GB/s (bytes read + written by a 256 MiB buffer copy)",
        f"memory floor of a step: {r['floor_ms']:.2f} ms (weight bytes / copy bandwidth)",
        f"achieved at batch 1: {r['achieved_gb_s']:.2f} GB/s of weights",
        f"time to first token, {r['ttft_prompt_tokens']}-token prompt: {r['ttft_uncached_ms']:.0f} ms new, "
        f"{r['ttft_cached_ms']:.1f} ms repeated (prefix cache: {r['ttft_cached_ms'] / r['steps'][0]['step_ms']:.2f} decode steps "
        f"of 1 turn, {r['ttft_cached_ms'] / r['steps'][-1]['step_ms']:.2f} of {r['steps'][-1]['batch']})",
    ]
    c = r["step_cost"]
    lines.append(
        f"step cost law: {c['fixed_s'] * 1e3:.2f} ms + {c['token_s'] * 1e3:.3f} ms/token + {c['kv_s'] * 1e9:.2f} ns/KV position read"
        f"  (fitted on {c['calibration_steps']} calibration + {c['observed_steps']} measured steps)"
    )
    return "\n".join(lines)


def _format_ceiling(r: dict) -> list[str]:
    if "multiply_ceiling" not in r:
        return []
    rates = ", ".join(f"{rate / 1e9:.1f} G on {bits}-bit inputs" for bits, rate in r["multiply_ceiling"].items())
    return [
        f"multiply ceiling: {rates} (integer products a second of the matmuls' multiplies alone, every core)",
        f"prefill at {100 * r['prefill_ceiling_share']:.0f}% of it (its matmuls' products at those rates, against its time)",
    ]


def _format_profile(p: dict) -> list[str]:
    lines = [
        f"      {p['launches']:.0f} launches, device busy {p['device_ms']:.2f} ms, idle between launches "
        f"{p['idle_ms']:.2f} ms, wall {p['wall_ms']:.2f} ms"
    ]
    for name, k in p["kernels"].items():
        rate = f"  {k['gb_s']:7.1f} GB/s" if k.get("gb_s") else ""
        lines.append(f"      {name:<10} {k['ms']:7.3f} ms  {100 * k['share']:5.1f}%{rate}")
    return lines
