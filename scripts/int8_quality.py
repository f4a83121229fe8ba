"""What SLOTSWARM_INT8 costs a model's predictions: its 8-bit inputs against 16-bit.

    python scripts/int8_quality.py --model qwen2.5-coder-1.5b [--runs 8] [--tokens 256] [--setting all]

Two CPU engines in one process, one with 8-bit inputs (SLOTSWARM_INT8=`--setting`: 1, compact
Q4_K and Q6_K, the default; all, Q4_0 and Q4_1 too) and one without, read the same code:
`--runs` runs of `--tokens` tokens, each from the middle of a Python standard-library module
(code, not its docstring), teacher-forced: every position's logits in one step, as a turn
verifying drafts gets them. One table row a model and path: perplexity, the mean and largest
KL divergence of its next-token distribution from the 16-bit one, and how often its argmax
is the 16-bit argmax. The README's SLOTSWARM_INT8 table came from it.
"""

from __future__ import annotations

import argparse
import os
import sysconfig
from pathlib import Path

import numpy as np

from gpu.engine import OpenCLEngine
from gpu.model.fetch import resolve_model
from gpu.model.load import load_model
from runtime.scheduling.units import ceil_div
from runtime.scheduling.work import Work

BLOCK = 16  # KV positions a block: one run's blocks are all the engine holds


def code_runs(tokenizer, runs: int, tokens: int) -> list[list[int]]:
    """`runs` runs of `tokens` tokens: the second `tokens` of every seventh stdlib module long enough."""
    modules = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[::7]
    chosen = []
    for module in modules:
        ids = tokenizer.encode(module.read_text(encoding="utf-8", errors="replace"))
        if len(ids) >= 3 * tokens:
            chosen.append(ids[tokens : 2 * tokens])
        if len(chosen) == runs:
            return chosen
    raise SystemExit(f"only {len(chosen)} stdlib modules have {3 * tokens} tokens; ask for fewer --runs or --tokens")


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def every_position(engine: OpenCLEngine, ids: list[int]) -> np.ndarray:
    """Log-probabilities of the next token at each of ids' positions, in one step."""
    table = list(range(ceil_div(len(ids), engine.block_size)))
    work = Work(turn=1, tokens=ids, start=0, block_table=table, sample=True, drafts=len(ids) - 1)
    try:
        return log_softmax(engine.step_logits([work]))
    finally:
        engine.forget(1)


def measure(model_name: str, runs: int, tokens: int, setting: str = "1") -> list[str]:
    model = load_model(resolve_model(model_name))
    engines = {}
    for inputs, flag in (("16-bit", "0"), ("8-bit", setting)):
        os.environ["SLOTSWARM_INT8"] = flag  # (read when an engine builds its kernels)
        engines[inputs] = OpenCLEngine(model, num_blocks=ceil_div(tokens, BLOCK), block_size=BLOCK, kernels="cpu")
    nll = {inputs: [] for inputs in engines}
    kl, same = [], []
    for ids in code_runs(engines["16-bit"].tokenizer, runs, tokens):
        logp = {inputs: every_position(engine, ids) for inputs, engine in engines.items()}
        targets = np.array(ids[1:])
        for inputs, lp in logp.items():
            nll[inputs].extend(-lp[np.arange(len(targets)), targets])
        wide, narrow = logp["16-bit"], logp["8-bit"]
        kl.extend((np.exp(wide) * (wide - narrow)).sum(axis=-1))
        same.extend(wide.argmax(axis=-1) == narrow.argmax(axis=-1))
    base = np.exp(np.mean(nll["16-bit"]))
    eight = np.exp(np.mean(nll["8-bit"]))
    moved = f"{np.mean(kl):.4f} | {np.max(kl):.3f} | {100 * np.mean(same):.1f}%"
    return [
        f"| {model_name} | 16-bit | {base:.3f} | - | - | - |",
        f"| {model_name} | 8-bit ({setting}) | {eight:.3f} ({100 * (eight / base - 1):+.2f}%) | {moved} |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", required=True, help="a catalogue name or GGUF path (repeatable)")
    parser.add_argument("--runs", type=int, default=8, help="runs of code read")
    parser.add_argument("--tokens", type=int, default=256, help="tokens a run")
    parser.add_argument("--setting", choices=["1", "all"], default="1", help="the 8-bit engine's SLOTSWARM_INT8")
    args = parser.parse_args()
    if args.runs < 1 or args.tokens < 2:
        parser.error("--runs must be at least 1 and --tokens at least 2")
    print(f"{args.runs} runs of {args.tokens} tokens from the middle of stdlib modules, teacher-forced; KL and argmax against 16-bit\n")
    print("| model | inputs | perplexity | mean KL | largest KL | same argmax |")
    print("|---|---|---|---|---|---|")
    for name in args.model:
        for line in measure(name, args.runs, args.tokens, args.setting):
            print(line, flush=True)


if __name__ == "__main__":
    main()
