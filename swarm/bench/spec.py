"""`swarm bench spec`: what speculative decoding does for the foreground turn.

One foreground turn at a time, alone on the device (idle), greedy, on two
tasks, with speculation off and on (runtime.scheduling.drafts) by each way of
drafting asked (`--variants`: lookup, and draft, a draft model, by default the
catalogue's for the model: qwen2.5-coder-0.5b for the 1.5B; `--draft` names
another), the order turned round in each of `--rounds` rounds so that a change
in the machine's load falls on all:

    edit   "return this function with one change": the answer copies most of
           the prompt, which prompt lookup drafts
    free   free text, which it rarely can

Every figure comes from the turn's end event: its inter-token latency
(`itl_s`), its draft tokens verified and kept (`drafted_tokens`,
`accepted_tokens`) and the steps that sampled for it (`sampling_steps`). The
bench prints, per task, the median ITL off and on and their ratio (issue 26's
targets: edit <= 0.5x, free >= 0.95x in speed, so <= 1/0.95 in ITL), the
acceptance rate, tokens per step, per variant, and whether the answers were
all the same (they must be: greedy speculation is exact). It says the load average, since the
machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import anyio

from runtime.errors import ConfigError

FUNCTION = '''def summarize_orders(orders, tax_rate, discount=None):
    """Return the subtotal, tax and total of a list of orders."""
    total = 0.0
    count = 0
    for order in orders:
        if order.get("cancelled"):
            continue
        price = order["price"] * order.get("quantity", 1)
        if discount is not None and price > discount["threshold"]:
            price -= price * discount["rate"]
        total += price
        count += 1
    tax = round(total * tax_rate, 2)
    return {
        "orders": count,
        "subtotal": round(total, 2),
        "tax": tax,
        "total": round(total + tax, 2),
    }
'''

TASKS = {
    "edit": (
        "Return this function with one change: rename the local variable `count` to `kept`. "
        "Answer with the whole function in one Python code block and nothing else.\n\n```python\n" + FUNCTION + "```"
    ),
    "free": "Write a short story, about 200 words, about a lighthouse keeper who finds a message in a bottle.",
}
VARIANTS = ("lookup", "draft")
EDIT_ITL_BOUND = 0.5  # on / off, issue 26's targets
FREE_ITL_BOUND = 1 / 0.95


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", metavar="MODEL", default="qwen2.5-coder-1.5b", help="GGUF path or catalogue name (default qwen2.5-coder-1.5b)"
    )
    parser.add_argument("--device", metavar="D", help="OpenCL device")
    parser.add_argument("--kernels", choices=("auto", "cpu", "gpu"), default="auto", help="kernel family")
    parser.add_argument("--rounds", type=int, default=3, metavar="N", help="off/on pairs per task (default 3)")
    parser.add_argument("--tokens", type=int, default=200, metavar="N", help="most tokens a turn decodes (default 200)")
    parser.add_argument("--tasks", default="edit,free", help="comma-separated: edit, free (default both)")
    parser.add_argument("--variants", default="lookup,draft", help="comma-separated ways of drafting: lookup, draft (default both)")
    parser.add_argument("--draft", metavar="MODEL", help="the draft model for the draft variant (default: the catalogue's for --model)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from gpu.engine import open_engine
    from swarm.api import open_draft

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        raise ConfigError(f"--tasks: unknown {unknown or 'none given'}; choose from {', '.join(TASKS)}")
    if args.rounds < 1 or args.tokens < 2:
        raise ConfigError("--rounds must be >= 1 and --tokens >= 2")
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not variants or any(v not in VARIANTS for v in variants):
        raise ConfigError(f"--variants: choose from {', '.join(VARIANTS)}, got {args.variants!r}")
    engine = open_engine(args.model, args.device, kernels=args.kernels)
    draft = open_draft(engine, args.draft) if "draft" in variants else None
    say = None if args.json else (lambda line: print(line, flush=True))
    report = measure(engine, {t: TASKS[t] for t in tasks}, rounds=args.rounds, tokens=args.tokens, say=say, variants=variants, draft=draft)
    report["cost_law"] = engine.cost.describe()
    report["model"] = getattr(engine, "model_name", None) or args.model
    if draft is not None:
        report["draft_model"] = draft.model_name
        report["draft_cost_law"] = draft.cost.describe()
    print(json.dumps(report) if args.json else format_report(report))
    return 0


def measure(engine, tasks: dict[str, str], *, rounds: int, tokens: int, say=None, variants=("lookup",), draft=None) -> dict:
    """Per task (name: prompt), every run's end-event figures, off and each
    variant in turn, the order reversed every other round. `draft`: the draft
    model's engine, for the draft variant."""
    report: dict = {"load_before": os.getloadavg()[0], "tasks": {}}
    modes = ["off", *variants]
    for task, prompt in tasks.items():
        runs: dict[str, list[dict]] = {mode: [] for mode in modes}
        for r in range(rounds):
            for mode in modes if r % 2 == 0 else modes[::-1]:
                got = anyio.run(_one_turn, engine, prompt, mode, tokens, draft)
                runs[mode].append(got)
                if say is not None:
                    kept = f"drafts kept {got['accepted']}/{got['drafted']}"
                    say(f"{task} round {r + 1} {mode:6} ITL {got['itl_s'] * 1e3:6.1f} ms  {got['tokens']} tokens "
                        f"in {got['steps']} steps, {kept}  (load {os.getloadavg()[0]:.1f})")  # fmt: skip
        report["tasks"][task] = summarize(runs)
    report["load_after"] = os.getloadavg()[0]
    return report


async def _one_turn(engine, prompt: str, speculate: str, tokens: int, draft=None) -> dict:
    from runtime.agent import Agent
    from runtime.events.kinds import Ended
    from runtime.scheduling.priority import FOREGROUND
    from swarm.api import Swarm

    class Asker(Agent):
        async def run(self) -> None:
            self.text = await self.complete([{"role": "user", "content": prompt}], max_tokens=tokens)

    async with Swarm(engine, slots=1, speculate=speculate, draft=draft if speculate == "draft" else None) as swarm:
        log = swarm.bus.subscribe(max_buffer=10**6)
        asker = await swarm.spawn(Asker("asker", FOREGROUND))
        await swarm.join(asker)
        log.close()
        (end,) = [e async for e in log if isinstance(e, Ended)]
    return {
        "itl_s": end.itl_s or 0.0,
        "ttft_s": end.ttft_s,
        "tokens": end.tokens,
        "steps": end.sampling_steps,
        "drafted": end.drafted_tokens,
        "accepted": end.accepted_tokens,
        "text": asker.text,
    }


def summarize(runs: dict[str, list[dict]]) -> dict:
    """Off against each variant: the median ITLs and their ratio, the drafts
    kept and tokens a step; whether every run answered the same."""
    off = runs["off"]
    itl_off = statistics.median(r["itl_s"] for r in off)
    summary: dict = {"itl_off_s": itl_off, "itl_off_all_s": [r["itl_s"] for r in off], "variants": {}}
    for mode, on in runs.items():
        if mode == "off":
            continue
        itl_on = statistics.median(r["itl_s"] for r in on)
        drafted = sum(r["drafted"] for r in on)
        summary["variants"][mode] = {
            "itl_on_s": itl_on,
            "itl_ratio": itl_on / itl_off if itl_off else None,
            "itl_on_all_s": [r["itl_s"] for r in on],
            "acceptance": sum(r["accepted"] for r in on) / drafted if drafted else None,
            "tokens_per_step_on": sum(r["tokens"] for r in on) / max(1, sum(r["steps"] for r in on)),
            "tokens": [r["tokens"] for r in on],
        }
    summary["same_answers"] = len({r["text"] for mode_runs in runs.values() for r in mode_runs}) == 1
    return summary


def format_report(report: dict) -> str:
    lines = [
        f"model {report['model']}, load average {report['load_before']:.1f} before, {report['load_after']:.1f} after",
        f"step cost law: {report['cost_law']}",
    ]
    if "draft_model" in report:
        lines.append(f"draft model {report['draft_model']}, its step cost law: {report['draft_cost_law']}")
    for task, s in report["tasks"].items():
        bound = EDIT_ITL_BOUND if task == "edit" else FREE_ITL_BOUND
        lines.append(f"{task:5} ITL off {s['itl_off_s'] * 1e3:.1f} ms, answers {'all the same' if s['same_answers'] else 'DIFFER'}")
        for mode, v in s["variants"].items():
            ratio = v["itl_ratio"]
            acceptance = "no drafts" if v["acceptance"] is None else f"{v['acceptance']:.0%} of drafts kept"
            met = ratio is not None and ratio <= bound
            versus = "no gaps to compare" if ratio is None else f"{ratio:.2f}x (target <= {bound:.2f}x: {'met' if met else 'missed'})"
            lines.append(
                f"      {mode:6} ITL {v['itl_on_s'] * 1e3:.1f} ms  on/off {versus}  "
                f"{acceptance}, {v['tokens_per_step_on']:.2f} tokens a step"
            )
    return "\n".join(lines)
