"""slotswarm side by side with llama.cpp: the same GGUF files, rounds alternating.

Run through scripts/llamacpp-bench.sh, which builds llama.cpp's `llama-bench` and
`llama-batched-bench` and passes their folder as --bin. Each round runs, per model,
`swarm bench engine --json` and the two llama.cpp tools (which goes first alternates
by round, so a drift in the machine's load falls on both), then one table gives each
measure's median over the rounds, its range, and the ratio:

- batch 1 step: slotswarm's 1-turn decode step; llama-bench's tg64 (-p 0 -n 64), ms per token.
- batch 8 step: slotswarm's 8-turn step; llama-batched-bench -npl 8, its generation
  time over its generated tokens per sequence (one step decodes 8 tokens).
- prefill: slotswarm's 256-token chunk; llama-bench's pp256, tokens/s.
- first token, 1,000-token prompt: slotswarm's uncached time to first token through its
  scheduler; llama-bench's pp1000 time (the prompt's one decode, whose logits give it).

With --isa avx2 (and a llama.cpp built for it: the shell script's --isa), slotswarm's CPU
kernels are built from PoCL's avx2 kernel library, without VNNI, as on a CPU that has AVX2
and no AVX-512; avx2-vnni keeps AVX-VNNI, which gpu/families.py takes where the CPU has it.
The table's footer names the device each slotswarm round ran on and, on the CPU family,
the machine's integer rate in each round (swarm bench engine's multiply ceiling) with the
share of it slotswarm's prefill reached: on a shared machine the rate moves between rounds,
and the share tells such a round from a slower kernel.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

MODELS = ("smollm2-135m", "qwen2.5-coder-1.5b")
PREFILL = 256  # slotswarm's timed prefill chunk (swarm/bench/engine.py PREFILL)
TTFT_PROMPT = 1000  # its time-to-first-token prompt (TTFT_PROMPT there)
DECODE = 64  # llama-bench's generated tokens for the batch-1 step
BATCH = 8
BATCHED_PROMPT = 64  # positions each sequence holds before llama-batched-bench's steps (PROMPT there)
BATCHED_STEPS = 32
# what a slotswarm process is told for each --isa: PoCL's kernel library (and so the
# compiler's target CPU) and, for avx2, no VNNI, which gpu/families.py would otherwise take
# from /proc/cpuinfo
ISA_ENVIRONMENT = {
    "native": {},
    "avx2": {"POCL_KERNELLIB_NAME": "avx2", "SLOTSWARM_VNNI": "0"},
    "avx2-vnni": {"POCL_KERNELLIB_NAME": "avx2"},
}


@dataclass(frozen=True)
class Measure:
    key: str
    label: str
    unit: str
    lower_is_better: bool  # a time, not a rate


MEASURES = (
    Measure("batch1_ms", "batch 1 step", "ms", True),
    Measure("batch8_ms", f"batch {BATCH} step", "ms", True),
    Measure("prefill_tok_s", f"prefill ({PREFILL} tokens)", "tok/s", False),
    Measure("ttft_ms", f"first token, {TTFT_PROMPT:,}-token prompt", "ms", True),
)


def parse_llama_bench(text: str) -> dict[str, float]:
    """The measures in `llama-bench -o json` output: an array of tests, each with its
    n_prompt, n_gen and avg_ns (mean time of one repetition of the whole test)."""
    out = {}
    for test in json.loads(text):
        n_prompt, n_gen, ns = test["n_prompt"], test["n_gen"], test["avg_ns"]
        if n_prompt == 0 and n_gen > 0:
            out["batch1_ms"] = ns / n_gen / 1e6
        elif n_gen == 0 and n_prompt == PREFILL:
            out["prefill_tok_s"] = n_prompt / (ns / 1e9)
        elif n_gen == 0 and n_prompt == TTFT_PROMPT:
            out["ttft_ms"] = ns / 1e6
    return out


def parse_batched_bench(text: str, batch: int = BATCH) -> dict[str, float]:
    """The batch step in `llama-batched-bench --output-format jsonl` output: one JSON
    object a line per (pp, tg, pl) (any other line is passed over); t_tg seconds for tg steps."""
    rows = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    rows = [r for r in rows if r["pl"] == batch]
    if not rows:
        raise ValueError(f"no llama-batched-bench result for {batch} sequences")
    return {f"batch{batch}_ms": 1e3 * rows[-1]["t_tg"] / rows[-1]["tg"]}


def parse_swarm_bench(text: str) -> tuple[dict[str, float], str]:
    """The measures in `swarm bench engine --json` output, and the device it ran on."""
    r = json.loads(text)
    steps = {s["batch"]: s["step_ms"] for s in r["steps"]}
    if r["ttft_prompt_tokens"] != TTFT_PROMPT:
        raise ValueError(f"swarm bench timed a {r['ttft_prompt_tokens']}-token prompt, not {TTFT_PROMPT}")
    figures = {
        "batch1_ms": steps[1],
        f"batch{BATCH}_ms": steps[BATCH],
        "prefill_tok_s": r["prefill_tok_per_s"],
        "ttft_ms": r["ttft_uncached_ms"],
    }
    if "multiply_ceiling" in r:  # the CPU family's: products a second on its narrowest inputs
        bits = min(r["multiply_ceiling"], key=int)
        figures["ceiling_g"], figures["ceiling_bits"] = r["multiply_ceiling"][bits] / 1e9, int(bits)
        figures["ceiling_share"] = r["prefill_ceiling_share"]
    return figures, r["device"]


def ratio(m: Measure, slotswarm: float, llama: float) -> str:
    """How much faster slotswarm is (or slower), as a person reads it."""
    speedup = llama / slotswarm if m.lower_is_better else slotswarm / llama
    return f"{speedup:.2f}x faster" if speedup >= 1 else f"{1 / speedup:.2f}x slower"


def cell(values: list[float]) -> str:
    if not values:
        return "-"
    digits = 0 if statistics.median(values) >= 100 else 1
    text = f"{statistics.median(values):,.{digits}f}"
    if len(values) > 1:
        text += f" ({min(values):,.{digits}f}-{max(values):,.{digits}f})"
    return text


def format_table(results: dict[str, dict[str, dict[str, list[float]]]]) -> str:
    """results[model][side][measure key] -> the values of every round; median (range)."""
    lines = [
        "| model | measure | slotswarm | llama.cpp | ratio (slotswarm vs llama.cpp) |",
        "|---|---|---|---|---|",
    ]
    for model, sides in results.items():
        for m in MEASURES:
            ours, theirs = sides["slotswarm"].get(m.key, []), sides["llama.cpp"].get(m.key, [])
            r = ratio(m, statistics.median(ours), statistics.median(theirs)) if ours and theirs else "-"
            lines.append(f"| {model} | {m.label} ({m.unit}) | {cell(ours)} | {cell(theirs)} | {r} |")
    return "\n".join(lines)


def format_ceilings(results: dict[str, dict[str, dict[str, list[float]]]]) -> list[str]:
    """A line per model whose slotswarm rounds measured the multiply ceiling: its rate and
    the prefill's share of it, round by round."""
    lines = []
    for model, sides in results.items():
        ours = sides["slotswarm"]
        if ours.get("ceiling_g"):
            rates = ", ".join(f"{g:.0f}" for g in ours["ceiling_g"])
            shares = ", ".join(f"{100 * s:.0f}" for s in ours["ceiling_share"])
            bits = ours["ceiling_bits"][0]
            lines.append(f"{model}: slotswarm's multiply ceiling by round {rates} G {bits}-bit products/s; its prefill at {shares}% of it")
    return lines


def run(cmd: list[str], environment: dict[str, str] | None = None) -> str:
    """The command's standard output (its log, on standard error, is shown only if it fails)."""
    settings = " ".join(f"{k}={v}" for k, v in (environment or {}).items())
    print("$ " + (settings + " " if settings else "") + " ".join(cmd), file=sys.stderr, flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(environment or {})})
    if done.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return done.stdout


def run_slotswarm(model: str, isa: str) -> tuple[dict[str, float], str]:
    bench = [sys.executable, "-m", "swarm.cli", "bench", "engine", "--model", model, "--json"]
    return parse_swarm_bench(run(bench, ISA_ENVIRONMENT[isa]))


def run_llama(bin_dir: Path, gguf: Path, threads: int, repetitions: int) -> dict[str, float]:
    prompts = f"{PREFILL},{TTFT_PROMPT}"
    bench = [str(bin_dir / "llama-bench"), "-m", str(gguf), "-p", prompts, "-n", str(DECODE), "-t", str(threads)]
    out = parse_llama_bench(run([*bench, "-r", str(repetitions), "-o", "json"]))
    context = BATCH * (BATCHED_PROMPT + BATCHED_STEPS)
    batched = [str(bin_dir / "llama-batched-bench"), "-m", str(gguf), "-c", str(context), "-t", str(threads)]
    batched += ["-npp", str(BATCHED_PROMPT), "-ntg", str(BATCHED_STEPS), "-npl", str(BATCH), "--output-format", "jsonl"]
    out.update(parse_batched_bench(run(batched)))
    return out


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", type=Path, required=True, help="folder holding llama-bench and llama-batched-bench")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each running both sides on every model (default: 3)")
    parser.add_argument("--models", nargs="+", default=list(MODELS), help=f"catalogue names or GGUF paths (default: {' '.join(MODELS)})")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp's threads (default: 2)")
    parser.add_argument("--repetitions", type=int, default=3, help="llama-bench's -r (default: 3)")
    parser.add_argument("--out", type=Path, help="also write every round's figures here, as JSON")
    parser.add_argument("--isa", choices=list(ISA_ENVIRONMENT), default="native",
                        help="the vector instructions both sides take: this CPU's, AVX2's alone, or AVX2's and AVX-VNNI's"
                             " (default: native)")  # fmt: skip
    args = parser.parse_args(argv)

    from gpu.model.fetch import resolve_model  # the project's catalogue and cache

    ggufs = {model: resolve_model(model) for model in args.models}
    results = {model: {"slotswarm": {}, "llama.cpp": {}} for model in args.models}
    loads, devices = [load()], set()
    started = time.monotonic()
    for k in range(args.rounds):
        for model, gguf in ggufs.items():
            for side in sorted(results[model], reverse=k % 2 == 1):
                if side == "slotswarm":
                    figures, device = run_slotswarm(str(gguf), args.isa)
                    devices.add(device)
                else:
                    figures = run_llama(args.bin, gguf, args.threads, args.repetitions)
                for key, value in figures.items():
                    results[model][side].setdefault(key, []).append(value)
        loads.append(load())
        print(f"round {k + 1}/{args.rounds} done, {time.monotonic() - started:.0f} s, load {loads[-1]}", file=sys.stderr, flush=True)
        if args.out:  # after every round, so an interrupted run keeps what it measured
            record = {"isa": args.isa, "devices": sorted(devices), "loads": loads, "results": results}
            args.out.write_text(json.dumps(record, indent=1))
    print(format_table(results))
    print(f"\n{args.rounds} round(s), median (min-max); load average (1, 5, 15 min) at the start and after each round: {'; '.join(loads)}")
    print(f"instructions: {args.isa}; slotswarm's device: {'; '.join(sorted(devices))}")
    for line in format_ceilings(results):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
