"""What constrained decoding costs, and whether what it gives is valid.

`run_constrained_bench`: 8 turns held to a JSON schema and 8 free ones, decoded
in alternate steps (so both see the same machine), greedy: the inter-token
latency of each, the masks' host time per row, and how much of it the overlap
hid (computed while the device still had queued work, gpu.masks.MaskTimes).

`run_validity`: generations on a model through the engine, in batches of 8,
over several schemas (nested objects, enums, arrays, strings with patterns),
greedy and sampled: how many finished, and whether every finished one parses
and validates against its schema.
"""

from __future__ import annotations

import json
import statistics
import time

from gpu.engine import OpenCLEngine
from runtime.errors import ConfigError
from runtime.scheduling.constraints import JsonSchema, TurnConstraint
from runtime.scheduling.units import ceil_div
from runtime.scheduling.work import Sampling, Work

BATCH = 8
WARM_UP = 4  # untimed steps first: a matcher's first masks build its lexer's states

# A long answer: the bench's turns stay inside the object for every timed step.
LONG_SCHEMA = {
    "type": "object",
    "properties": {
        "findings": {
            "type": "array",
            "minItems": 64,
            "items": {
                "type": "object",
                "properties": {
                    "file": {"type": "string", "pattern": "^[a-z_]{1,12}\\.py$"},
                    "line": {"type": "integer", "minimum": 1, "maximum": 9999},
                    "severity": {"enum": ["low", "medium", "high"]},
                    "message": {"type": "string", "maxLength": 40},
                },
                "required": ["file", "line", "severity", "message"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["findings"],
    "additionalProperties": False,
}

SCHEMAS = {
    "finding": {
        "type": "object",
        "properties": {
            "file": {"type": "string", "pattern": "^[a-z_]{1,12}\\.py$"},
            "line": {"type": "integer", "minimum": 1, "maximum": 9999},
            "severity": {"enum": ["low", "medium", "high"]},
            "message": {"type": "string", "maxLength": 60},
        },
        "required": ["file", "line", "severity", "message"],
        "additionalProperties": False,
    },
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 30},
            "age": {"type": "integer", "minimum": 0, "maximum": 130},
            "address": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 30}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "age", "address"],
        "additionalProperties": False,
    },
    "tags": {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{2,10}$"}, "minItems": 1, "maxItems": 5},
            "done": {"type": "boolean"},
        },
        "required": ["tags", "done"],
        "additionalProperties": False,
    },
    "plan": {
        "type": "object",
        "properties": {
            "steps": {
                "type": "array",
                "maxItems": 4,
                "items": {
                    "type": "object",
                    "properties": {"do": {"enum": ["read", "edit", "test", "ask"]}, "why": {"type": "string", "maxLength": 40}},
                    "required": ["do", "why"],
                    "additionalProperties": False,
                },
            },
            "confidence": {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.01},
        },
        "required": ["steps", "confidence"],
        "additionalProperties": False,
    },
}

ASKS = {
    "finding": "Report one bug you might find in a Python file, as JSON.",
    "person": "Describe a fictional person with their address, as JSON.",
    "tags": "Give a few tags for a blog post about gardening, as JSON.",
    "plan": "Plan how to fix a failing unit test, as JSON.",
}


class _Turn:
    def __init__(self, turn: int, prompt: list[int], table: list[int], constraint: JsonSchema | None, sampling: Sampling) -> None:
        self.turn, self.prompt, self.table, self.sampling, self.out = turn, prompt, table, sampling, []
        seen = lambda a, b: (self.prompt + self.out)[a:b]  # noqa: E731
        self.constraint = TurnConstraint(constraint, len(prompt), seen) if constraint is not None else None

    def work(self, engine: OpenCLEngine) -> list[Work]:
        """Its next step's work: the prompt in chunks the engine holds, or a decode."""
        if not self.out:
            m = engine.max_batch_tokens
            return [Work(self.turn, self.prompt[c : c + m], c, self.table, c + m >= len(self.prompt), self.sampling, self.constraint)
                    for c in range(0, len(self.prompt), m)]  # fmt: skip
        return [Work(self.turn, [self.out[-1]], len(self.prompt) + len(self.out) - 1, self.table, True, self.sampling, self.constraint)]


def _prefill(engine: OpenCLEngine, turns: list[_Turn]) -> None:
    for t in turns:
        *chunks, last = t.work(engine)
        for chunk in chunks:
            engine.step([chunk])
        t.out.append(engine.step([last])[0])


def _tables(engine: OpenCLEngine, n: int, positions: int) -> list[list[int]]:
    span = ceil_div(positions, engine.block_size)
    if n * span > engine.num_blocks:
        raise ValueError(f"the bench needs {n * span} KV blocks, the engine has {engine.num_blocks}")
    return [list(range(i * span, (i + 1) * span)) for i in range(n)]


def blocks_needed(steps: int, block_size: int = 16, prompt: int = 64) -> int:
    return 2 * BATCH * ceil_div(prompt + WARM_UP + steps + 2, block_size)


def run_constrained_bench(engine: OpenCLEngine, steps: int = 64) -> dict:
    """Alternate decode steps of 8 free turns and 8 held to LONG_SCHEMA."""
    tok = engine.tokenizer
    prompt = tok.chat([{"role": "user", "content": "List every finding of a code review as JSON."}])
    tables = _tables(engine, 2 * BATCH, len(prompt) + WARM_UP + steps + 2)
    schema = JsonSchema(json.dumps(LONG_SCHEMA))
    engine.constraints.check(schema)  # (compiled before the clock runs, as an agent's check does)
    free = [_Turn(i, prompt, tables[i], None, Sampling()) for i in range(BATCH)]
    held = [_Turn(BATCH + i, prompt, tables[BATCH + i], schema, Sampling()) for i in range(BATCH)]
    _prefill(engine, free + held)
    times: dict[str, list[float]] = {"free": [], "held": []}
    for step in range(WARM_UP + steps):
        if step == WARM_UP:
            engine.mask_times.clear()
            times = {"free": [], "held": []}
        for name, turns in (("free", free), ("held", held)):
            batch = [t.work(engine)[0] for t in turns]
            t0 = time.perf_counter()
            tokens = engine.step(batch)
            times[name].append(time.perf_counter() - t0)
            for t, token in zip(turns, tokens, strict=False):
                t.out.append(token)
    m = engine.mask_times
    for t in free + held:
        engine.forget(t.turn)
    free_ms, held_ms = 1e3 * statistics.median(times["free"]), 1e3 * statistics.median(times["held"])
    # (each held step against the free step just before it: the machine's load drifts less in between)
    paired = statistics.median(h / f for f, h in zip(times["free"], times["held"], strict=False))
    return {
        "device": engine.device_name,
        "model": engine.model_name,
        "batch": BATCH,
        "steps": steps,
        "free_itl_ms": free_ms,
        "held_itl_ms": held_ms,
        "ratio": held_ms / free_ms,
        "paired_ratio": paired,
        "mask_ms_per_row": 1e3 * m.compute_s / max(1, m.rows),
        "mask_ms_per_step": 1e3 * m.compute_s / max(1, m.steps),
        "mask_cpu_ms_per_row": 1e3 * m.cpu_s / max(1, m.rows),
        "exposed_ms_per_step": 1e3 * m.exposed_s / max(1, m.steps),
        "hidden": 1.0 - m.exposed_s / m.compute_s if m.compute_s else 1.0,
        "held_sample": tok.decode(held[0].out)[:160],
    }


def format_constrained(r: dict) -> str:
    return "\n".join([
        f"device: {r['device']}, model {r['model']}: {r['batch']} turns, {r['steps']} decode steps each way, alternating",
        f"  inter-token latency, free:            {r['free_itl_ms']:7.2f} ms (median step)",
        f"  inter-token latency, JSON schema:     {r['held_itl_ms']:7.2f} ms  "
        f"({r['ratio']:.3f}x; step by step, median {r['paired_ratio']:.3f}x)",
        f"  masks' host time: {r['mask_ms_per_row']:.3f} ms a row, {r['mask_ms_per_step']:.3f} ms a step "
        f"(CPU time {r['mask_cpu_ms_per_row']:.3f} ms a row)",
        f"  computed while the device had work queued: {100 * r['hidden']:.1f}% "
        f"(the device ran dry first: {r['exposed_ms_per_step']:.3f} ms a step)",
        f"  a held turn wrote: {r['held_sample']!r}",
    ])  # fmt: skip


def run_validity(engine: OpenCLEngine, generations: int = 80, max_tokens: int = 200, seed: int = 0) -> dict:
    """`generations` constrained turns in batches of 8, schemas and sampling in turn."""
    try:
        import jsonschema  # the judge of validity, not the engine's: a test dependency
    except ImportError:
        raise ConfigError("--validity checks answers with jsonschema: pip install jsonschema (or slotswarm[test])") from None
    tok = engine.tokenizer
    names = list(SCHEMAS)
    samplings = [Sampling(), Sampling(temperature=0.8, seed=seed), Sampling(temperature=1.0, top_p=0.9, seed=seed + 1)]
    results = {"model": engine.model_name, "generations": 0, "finished": 0, "valid": 0, "invalid": [], "unfinished": [], "by_schema": {}}
    for n in names:
        engine.constraints.check(JsonSchema(json.dumps(SCHEMAS[n])))
    k = 0
    while k < generations:
        turns = []
        for slot in range(min(BATCH, generations - k)):
            name = names[(k + slot) % len(names)]
            sampling = samplings[((k + slot) // len(names)) % len(samplings)]
            sampling = Sampling(sampling.temperature, sampling.top_p, seed + k + slot) if not sampling.greedy else sampling
            prompt = tok.chat([{"role": "user", "content": ASKS[name] + " Vary the details: #" + str(k + slot)}])
            turn = _Turn(k + slot, prompt, [], JsonSchema(json.dumps(SCHEMAS[name])), sampling)
            turn.name = name
            turns.append(turn)
        tables = _tables(engine, len(turns), max(len(t.prompt) for t in turns) + max_tokens + 1)
        for t, table in zip(turns, tables, strict=False):
            t.table = table
        _prefill(engine, turns)
        eos = engine.eos_token_ids
        for _ in range(max_tokens - 1):
            live = [t for t in turns if t.out[-1] not in eos]
            if not live:
                break
            for t, token in zip(live, engine.step([t.work(engine)[0] for t in live]), strict=False):
                t.out.append(token)
        for t in turns:
            engine.forget(t.turn)
            stats = results["by_schema"].setdefault(t.name, {"generations": 0, "finished": 0, "valid": 0})
            stats["generations"] += 1
            results["generations"] += 1
            if t.out[-1] not in eos:
                results["unfinished"].append({"schema": t.name, "text": tok.decode(t.out)[-120:]})
                continue  # cut off by max_tokens: not an answer to judge
            stats["finished"] += 1
            results["finished"] += 1
            text = tok.decode([x for x in t.out if x not in eos])
            try:
                jsonschema.validate(json.loads(text), SCHEMAS[t.name])
            except (ValueError, jsonschema.ValidationError) as exc:
                results["invalid"].append({"schema": t.name, "text": text, "why": str(exc)[:200]})
                continue
            stats["valid"] += 1
            results["valid"] += 1
        k += len(turns)
    return results


def format_validity(r: dict) -> str:
    lines = [f"{r['model']}: {r['generations']} generations, {r['finished']} finished, {r['valid']} valid"]
    for name, s in r["by_schema"].items():
        lines.append(f"  {name:<8} {s['generations']:4d} generations, {s['finished']:4d} finished, {s['valid']:4d} valid")
    for cut in r["unfinished"][:3]:
        lines.append(f"  cut off at max_tokens ({cut['schema']}): ...{cut['text']!r}")
    for bad in r["invalid"][:5]:
        lines.append(f"  INVALID ({bad['schema']}): {bad['text'][:120]!r}: {bad['why']}")
    return "\n".join(lines)
