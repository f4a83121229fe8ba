"""`swarm generate "message"`: one chat turn on the model, streamed to stdout.

The chat template is applied to the single user message and the turn runs like any
agent's, through a one-slot swarm: prefilled in chunks, then decoded a token a step
until an end-of-turn token or --max-tokens (an answer cut off there says so on stderr).
With --json nothing streams; one JSON object is printed at the end:
{"prompt_ids": [...], "tokens": [...], "text": "...", "finish_reason": "eos" | "length" | "context",
 "ttft_s": ..., "turn_s": ..., "tokens_per_s": ...} (seconds from the request; tokens a second after the first).
"""

from __future__ import annotations

import argparse
import json
import sys

import anyio

from runtime.errors import ConfigError
from runtime.scheduling.units import ceil_div
from runtime.scheduling.work import GREEDY, Engine, Sampling
from swarm import FOREGROUND, Agent, Swarm, TurnHandle

BLOCK_SIZE = 16


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("generate", help="run one chat turn on the model and stream the answer")
    parser.add_argument("message", help="the user message; - reads it from stdin")
    parser.add_argument("--max-tokens", type=int, default=256, metavar="N", help="most new tokens (default 256)")
    parser.add_argument("--greedy", action="store_true", help="always take the likeliest token (the default)")
    parser.add_argument("--temperature", type=float, metavar="T", help="sample at temperature T instead")
    parser.add_argument("--top-p", type=float, metavar="P", help="with --temperature: nucleus sampling mass (default 1)")
    parser.add_argument("--seed", type=int, metavar="S", help="with --temperature: sampling seed (default 0)")
    parser.add_argument(
        "--model",
        metavar="MODEL",
        help="GGUF path, catalogue name (smollm2-135m, the default; qwen2.5-coder-0.5b; qwen2.5-coder-1.5b; gemma3-270m; "
        "see swarm models) or hf:OWNER/REPO/FILE; env SWARM_MODEL",
    )
    parser.add_argument(
        "--device",
        metavar="D",
        help='OpenCL device, "platform:device" index or name part (default: a GPU if any, else the first usable; env SWARM_DEVICE)',
    )
    parser.add_argument(
        "--kernels", choices=("auto", "cpu", "gpu"), default="auto", help="kernel family: auto (shaped for the device), cpu or gpu"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object at the end instead of streaming")
    parser.set_defaults(func=run)


def sampling_from(args: argparse.Namespace) -> Sampling:
    if args.greedy and args.temperature is not None:
        raise ConfigError("--greedy and --temperature exclude each other")
    if args.temperature is None:
        if args.top_p is not None or args.seed is not None:
            raise ConfigError("--top-p and --seed only apply to sampling: add --temperature T (greedy decoding ignores them)")
        return GREEDY
    top_p = 1.0 if args.top_p is None else args.top_p
    if not args.temperature >= 0 or not 0 < top_p <= 1:
        raise ConfigError(f"need --temperature >= 0 and 0 < --top-p <= 1, got {args.temperature}, {top_p}")
    return Sampling(temperature=args.temperature, top_p=top_p, seed=0 if args.seed is None else args.seed)


def run(args: argparse.Namespace) -> int:
    from gpu.engine import open_engine
    from gpu.model.fetch import resolve_model
    from gpu.model.load import load_model
    from gpu.model.tokenizer import Tokenizer

    if args.max_tokens < 1:
        raise ConfigError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    sampling = sampling_from(args)
    message = sys.stdin.read() if args.message == "-" else args.message
    model = load_model(resolve_model(args.model))
    prompt = Tokenizer.from_model(model).chat([{"role": "user", "content": message}])
    limit = model.config.context_length
    max_tokens = min(args.max_tokens, limit - len(prompt))
    if max_tokens < 1:
        raise ConfigError(f"the prompt is {len(prompt)} tokens, the model's context is {limit}")
    # One turn: a KV pool just big enough for it, not a fraction of the device.
    blocks = ceil_div(len(prompt) + max_tokens, BLOCK_SIZE)
    engine = open_engine(model, args.device, kernels=args.kernels, block_size=BLOCK_SIZE, num_blocks=blocks)
    turn = anyio.run(_generate, engine, prompt, max_tokens, sampling, not args.json)
    reason = turn.ended.reason if turn.ended is not None else None
    if args.json:
        text = engine.tokenizer.decode(turn.tokens, skip_special=True)
        print(json.dumps({"prompt_ids": prompt, "tokens": turn.tokens, "text": text, "finish_reason": reason, **timings(turn)}))
    else:
        sys.stdout.write("\n")
        sys.stdout.flush()  # the answer first, then the note on it
        if reason in CUT_OFF:
            print(CUT_OFF[reason].format(n=max_tokens), file=sys.stderr)
    return 0


CUT_OFF = {
    "length": "(the answer was cut off at {n} tokens: --max-tokens N for more)",
    "context": "(the answer was cut off at the end of the model's context, after {n} tokens)",
}


def timings(turn: TurnHandle) -> dict[str, float | None]:
    """Seconds from the request to the first token and to the last, and the decode
    rate after the first token (None with fewer than two tokens)."""
    times = turn.token_times
    decode_s = times[-1] - times[0] if len(times) > 1 else 0.0
    return {
        "ttft_s": turn.ttft_s,
        "turn_s": turn.turn_s,
        "tokens_per_s": (len(times) - 1) / decode_s if decode_s > 0 else None,
    }


async def _generate(engine: Engine, prompt: list[int], max_tokens: int, sampling: Sampling, stream: bool) -> TurnHandle:
    """The turn, through a one-slot swarm: the same client, owner and scheduler
    every agent's turn goes through."""
    async with Swarm(engine, slots=1) as swarm:
        agent = await swarm.spawn(Agent("generate", FOREGROUND))
        async with agent.generate(prompt, max_tokens=max_tokens, sampling=sampling) as turn:
            async for piece in turn:
                if stream:
                    sys.stdout.write(piece)
                    sys.stdout.flush()
    return turn
