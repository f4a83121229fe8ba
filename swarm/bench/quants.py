"""What reading each tensor type costs the matmul kernels, per weight byte.

    swarm bench engine --quants [--model M]

For each type a one-layer synthetic model with the model's width (rounded up to the
K-quants' 256) and feed-forward size is built, every layer matrix in that type, and batch-1
decode steps are profiled. The figure is the matmul launches' device time divided by the
bytes they read, both as stored on the device and as stored in the GGUF file; the ratio to
Q4_1 (the default model's type) is what the K-quants are judged by. Types are interleaved
round by round, in reverse order every other round, and each ratio is the median of the
rounds' own ratios (a type against Q4_1 measured in the same round), so a noisy machine's
drift between rounds cancels out of it.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import gguf

from gpu.engine import OpenCLEngine, open_engine
from gpu.model.load import ModelConfig
from gpu.model.synthetic import write_tiny_gguf
from runtime.scheduling.units import ceil_div
from runtime.scheduling.work import Work

Q = gguf.GGMLQuantizationType
TYPES = (Q.Q4_1, Q.Q4_0, Q.Q5_0, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K)
MATMULS = ("qkv", "out", "swiglu", "down")


def run_quant_bench(config: ModelConfig, *, device=None, kernels=None, steps: int = 8, rounds: int = 7) -> dict:
    d = ceil_div(config.d_model, 256) * 256
    d_ff = ceil_div(config.d_ff, 256) * 256
    heads = max(1, d // 64)
    engines = {}
    with tempfile.TemporaryDirectory(prefix="slotswarm-quants-") as tmp:
        for qtype in TYPES:
            path = write_tiny_gguf(Path(tmp) / f"{qtype.name}.gguf", n_layers=1, d_model=d, d_ff=d_ff, n_heads=heads,
                                   n_kv_heads=heads, weight_type=qtype, embed_type=Q.Q8_0)  # fmt: skip
            engines[qtype] = open_engine(path, device, kernels=kernels, profile=True, num_blocks=4)
    per_byte: dict[Q, list[float]] = {q: [] for q in TYPES}
    for r in range(rounds):
        for qtype in TYPES if r % 2 == 0 else TYPES[::-1]:
            per_byte[qtype].append(_ns_per_device_byte(engines[qtype], steps))
    out = {}
    base_bytes = _bytes_ratio(engines[Q.Q4_1])
    for qtype, engine in engines.items():
        w = engine.weights
        device_bytes = sum(m.nbytes for L in w.layers for m in (L.qkv, L.out, L.gate_up, L.down))
        file_bytes = sum(m.file_bytes for L in w.layers for m in (L.qkv, L.out, L.gate_up, L.down))
        ns = statistics.median(per_byte[qtype])
        vs = statistics.median(a / b for a, b in zip(per_byte[qtype], per_byte[Q.Q4_1], strict=False))
        out[qtype.name] = {
            "kind": w.layers[0].down.kind,
            "ns_per_device_byte": ns,
            "ns_per_file_byte": ns * device_bytes / file_bytes,
            "vs_q4_1_device": vs,
            "vs_q4_1_file": vs * (device_bytes / file_bytes) / base_bytes,
            "device_bytes_per_weight": device_bytes / (file_bytes / gguf.GGML_QUANT_SIZES[qtype][1] * gguf.GGML_QUANT_SIZES[qtype][0]),
        }
    return {"shape": {"d_model": d, "d_ff": d_ff}, "kernels": next(iter(engines.values())).kernels, "types": out}


def _bytes_ratio(engine: OpenCLEngine) -> float:
    w = engine.weights
    return sum(m.nbytes for m in w.matrices()[:-1]) / sum(m.file_bytes for m in w.matrices()[:-1])


def _ns_per_device_byte(engine: OpenCLEngine, steps: int) -> float:
    """Median over batch-1 decode steps of the matmuls' device ns per weight byte read."""
    tokens = list(range(1, 9))
    table = [0, 1]
    engine.step([Work(turn=0, tokens=tokens, start=0, block_table=table, sample=False)])
    rates = []
    for k in range(steps + 1):
        engine.step([Work(turn=0, tokens=[3], start=len(tokens) + k, block_table=table, sample=True)])
        launches = [(b, e) for name, b, e in engine.last_profile if name in MATMULS]
        ns = sum(e.profile.end - e.profile.start for _, e in launches)
        rates.append(ns / sum(b for b, _ in launches))
    engine.forget(0)
    return statistics.median(rates[1:])


def format_quant_report(r: dict) -> str:
    lines = [f"matmul cost per weight byte, {r['kernels']} kernels, d_model {r['shape']['d_model']}, "
             f"d_ff {r['shape']['d_ff']} (batch 1, medians of rounds; ratios of each round's own):"]  # fmt: skip
    for name, t in r["types"].items():
        lines.append(
            f"  {name:<5} as {t['kind']:<5} {t['device_bytes_per_weight']:.3f} B/weight on device: "
            f"{t['ns_per_device_byte'] * 1e3:7.1f} ps/device byte ({t['vs_q4_1_device']:.2f}x Q4_1), "
            f"{t['ns_per_file_byte'] * 1e3:7.1f} ps/file byte ({t['vs_q4_1_file']:.2f}x Q4_1)"
        )
    return "\n".join(lines)
