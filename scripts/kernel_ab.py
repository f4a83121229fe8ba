"""This checkout's OpenCL kernels against another tree's, in one process.

    python scripts/kernel_ab.py --against TREE [--model M] [--kernels cpu|gpu]
                                [--steps N] [--chunks N] [--json]

Two engines on the same model and device, one built from TREE's kernels/ and one from this
checkout's, take turns (A B, then B A) step by step, so both meet the same machine from one
minute to the next: on a shared machine whose speed moves by half within minutes, runs in
turn by separate processes compare the minutes more than the kernels. It reports

- batch-1 decode steps: each side's median, and the median of the paired ratios (new /
  base, each step against its partner), with whether both chose the same greedy tokens and
  whether the steps took the CPU family's one launch a layer (kernels/cpu/layer.cl);
- one prompt chunk (the engine's largest, from position 0): each launch kind's time
  (launch name and weight bytes: Q4_K and Q6_K down are two kinds), as medians and ratios.

Only the kernel sources differ; the host code is this checkout's, so TREE's kernels must
take the same arguments. A change to the host side needs two processes (scripts/gpu-check.sh
--against). The chunks run on a second pair of engines that time every launch with OpenCL
events (the kinds need them); a profiled engine keeps each matmul a launch of its own, so
the steps run on engines that do not, as a user's steps do.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import numpy as np

import gpu.families
from gpu.engine import OpenCLEngine
from gpu.model.fetch import resolve_model
from gpu.model.load import Model, load_model
from runtime.errors import SlotswarmError
from runtime.scheduling.work import Work

PROMPT = 32  # the decode steps' prompt, in tokens
BLOCKS = 80  # each engine's KV blocks: a prompt chunk of 256 positions and the steps' 32 + 256


@contextlib.contextmanager
def kernels_from(tree: Path | None) -> Iterator[None]:
    """Engines built inside read their kernel sources from tree/kernels (None: this checkout's)."""
    own = gpu.families.source
    if tree is not None:
        gpu.families.source = lambda name: (tree / "kernels" / f"{name}.cl").read_text(encoding="utf-8")
    try:
        yield
    finally:
        gpu.families.source = own


def paired(base: list[float], new: list[float]) -> dict:
    """Medians and the median of the paired ratios new / base."""
    return {"base": statistics.median(base), "new": statistics.median(new),
            "ratio": statistics.median(b / a for a, b in zip(base, new, strict=True))}  # fmt: skip


def decode_steps(engines: dict[str, OpenCLEngine], steps: int) -> dict:
    """Batch-1 steps in turn, greedy, their positions wrapping at PROMPT + 256 (a long run's
    attention then costs what a short turn's does)."""
    tokens, times = {}, {side: [] for side in engines}
    prompt = list(range(10, 10 + PROMPT))
    for side, engine in engines.items():
        tokens[side] = engine.step([Work(turn=1, tokens=prompt, start=0, block_table=list(range(BLOCKS)), sample=True)])
    for s in range(steps):
        for side in ("base", "new") if s % 2 == 0 else ("new", "base"):
            work = Work(turn=1, tokens=tokens[side][-1:], start=PROMPT + s % 256, block_table=list(range(BLOCKS)), sample=True)
            t0 = time.perf_counter()
            tokens[side] += engines[side].step([work])
            times[side].append(1e3 * (time.perf_counter() - t0))
    for engine in engines.values():
        engine.forget(1)
    return {"ms": paired(times["base"], times["new"]), "same_tokens": tokens["base"] == tokens["new"]}


def prompt_chunks(engines: dict[str, OpenCLEngine], chunks: int) -> dict:
    """A prompt chunk at a time on each engine in turn (the first of each unmeasured: it
    warms the caches), each launch kind's time summed over the chunk."""
    n = engines["new"].max_batch_tokens
    prompt = np.random.default_rng(0).integers(0, engines["new"].config.vocab_size, n).tolist()
    walls, kinds = {side: [] for side in engines}, {side: defaultdict(list) for side in engines}
    for c in range(chunks + 1):
        for side in ("base", "new") if c % 2 == 0 else ("new", "base"):
            engine = engines[side]
            t0 = time.perf_counter()
            engine.step([Work(turn=2, tokens=prompt, start=0, block_table=list(range(BLOCKS)), sample=True)])
            wall = 1e3 * (time.perf_counter() - t0)
            engine.forget(2)
            if c == 0:
                continue
            walls[side].append(wall)
            per: dict[str, float] = defaultdict(float)
            for name, nbytes, event in engine.last_profile:
                per[f"{name} {nbytes / 1e6:.2f} MB"] += (event.profile.end - event.profile.start) / 1e6
            for kind, ms in per.items():
                kinds[side][kind].append(ms)
    by_kind = {kind: paired(ms, kinds["new"][kind]) for kind, ms in kinds["base"].items()}  # (the host's launches: the same)
    return {"tokens": n, "ms": paired(walls["base"], walls["new"]),
            "kinds": dict(sorted(by_kind.items(), key=lambda kv: -kv[1]["base"]))}  # fmt: skip


def engines_for(model: Model, tree: Path, kernels: str, profile: bool) -> dict[str, OpenCLEngine]:
    """The base engine from `tree`'s kernels, the new one from this checkout's."""
    engines = {}
    for side, source in (("base", tree), ("new", None)):
        with kernels_from(source):
            engines[side] = OpenCLEngine(model, num_blocks=BLOCKS, kernels=kernels, profile=profile)
    return engines


def compare(model: Model, tree: Path, kernels: str, steps: int, chunks: int) -> dict:
    """The report: `tree`'s kernels (base) against this checkout's (new) on `model`."""
    report = {"model": model.path.name, "against": str(tree)}
    if steps:
        # unprofiled: a profile keeps every matmul a launch of its own, so only these engines
        # step as a user's do (the CPU family's one launch a layer, where the model allows)
        engines = engines_for(model, tree, kernels, profile=False)
        report["decode"] = decode_steps(engines, steps)
        report["decode"]["layer_launch"] = engines["new"].launches.one_token is not None
    if chunks:
        engines = engines_for(model, tree, kernels, profile=True)
        report["prompt"] = prompt_chunks(engines, chunks)
    report["device"], report["kernels"] = engines["new"].device.name, engines["new"].kernels
    return report


def table(r: dict) -> str:
    lines = [f"{r['model']} on {r['device']} ({r['kernels']} kernels): base {r['against']}, new this checkout"]
    if "decode" in r:
        d = r["decode"]
        how = " (a launch a layer)" if d["layer_launch"] else ""
        lines.append(f"batch-1 step{how}: base {d['ms']['base']:.2f} ms, new {d['ms']['new']:.2f} ms, paired ratio {d['ms']['ratio']:.3f}"
                     f"; same tokens: {'yes' if d['same_tokens'] else 'no'}")  # fmt: skip
    if "prompt" in r:
        p, ms = r["prompt"], r["prompt"]["ms"]
        lines.append(f"{p['tokens']}-token chunk: base {ms['base']:.0f} ms, new {ms['new']:.0f} ms, paired ratio {ms['ratio']:.3f}")
        for kind, m in p["kinds"].items():
            lines.append(f"    {kind:28s} base {m['base']:9.2f} ms  new {m['new']:9.2f} ms  ratio {m['ratio']:.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", type=Path, required=True, metavar="TREE", help="the checkout whose kernels/ is the base")
    parser.add_argument("--model", default="smollm2-135m", help="a GGUF path or catalogue name (default smollm2-135m)")
    parser.add_argument("--kernels", default="cpu", choices=("cpu", "gpu"))
    parser.add_argument("--steps", type=int, default=200, help="batch-1 steps a side (0: none)")
    parser.add_argument("--chunks", type=int, default=4, help="prompt chunks a side, after one to warm up (0: none)")
    parser.add_argument("--json", action="store_true", help="the report as JSON")
    args = parser.parse_args(argv)
    if not (args.against / "kernels" / "quant.cl").is_file():
        print(f"--against: no kernels/ in {args.against}", file=sys.stderr)
        return 2
    if args.steps < 0 or args.chunks < 0 or args.steps == args.chunks == 0:
        print("--steps and --chunks must be at least 0, and not both 0", file=sys.stderr)
        return 2
    try:  # an unknown model, or TREE's kernels failing to build: one line
        report = compare(load_model(resolve_model(args.model)), args.against.resolve(), args.kernels, args.steps, args.chunks)
    except SlotswarmError as exc:
        print(f"kernel_ab: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if args.json else table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
