"""`swarm serve`: an OpenAI-compatible endpoint where outside agents join the swarm.

Each caller is an agent (X-Swarm-Agent, else the body's `user`, else one per
connection) with a priority (X-Swarm-Priority: foreground, background or an
integer, higher first; or the body's `priority`, lower first as in vLLM;
background by default). A foreground request preempts background turns at the
next token boundary.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

import anyio

from runtime.errors import ConfigError
from runtime.scheduling.turns import Policy


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve the swarm over an OpenAI-compatible HTTP API",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--host",
        default=os.environ.get("SWARM_HOST", "127.0.0.1"),
        help="address to bind (default: 127.0.0.1, loopback only; env SWARM_HOST)",
    )
    p.add_argument(
        "--port", type=int, default=os.environ.get("SWARM_PORT", 8000), help="port, 0 for any free one (the URL is printed; env SWARM_PORT)"
    )
    p.add_argument(
        "--model",
        metavar="MODEL",
        help="GGUF path, catalogue name (smollm2-135m, the default; qwen2.5-coder-0.5b; qwen2.5-coder-1.5b; gemma3-270m; "
        "see swarm models) or hf:OWNER/REPO/FILE; env SWARM_MODEL",
    )
    p.add_argument("--served-model-name", metavar="NAME", help="the model id clients send (default: the file's name without .gguf)")
    p.add_argument(
        "--device",
        metavar="D",
        help='OpenCL device, "platform:device" index or name part (default: a GPU if any, else the first usable; env SWARM_DEVICE)',
    )
    p.add_argument(
        "--kernels", choices=("auto", "cpu", "gpu"), default="auto", help="kernel family: auto (shaped for the device), cpu or gpu"
    )
    p.add_argument("--slots", type=int, default=8, help="turns decoded together (default 8)")
    p.add_argument("--policy", default=Policy.RESIDENT.value, help="scheduling policy: " + ", ".join(x.value for x in Policy))
    p.add_argument(
        "--step-tokens",
        type=int,
        metavar="N",
        help="tokens one step may process, which bounds every foreground wait (default: 128, or what the engine batches per step if less)",
    )
    p.add_argument("--no-shaping", action="store_true", help="turn step shaping for the foreground off")
    p.add_argument(
        "--speculate",
        metavar="{off,lookup,draft[:MODEL]}",
        default="off",
        help="speculative decoding for the foreground turn (and a turn running alone): lookup drafts by prompt lookup, "
        "draft by a draft model with the same tokenizer (draft:MODEL names it) (default off)",
    )
    p.add_argument(
        "--api-key",
        metavar="KEY",
        default=os.environ.get("SWARM_API_KEY"),
        help="require `Authorization: Bearer KEY` on every path but /health; "
        "a browser opens the page at /?key=KEY (env SWARM_API_KEY; no default)",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        metavar="N",
        help="refuse a background request (429) that would wait for a slot behind N others already waiting (default: no limit)",
    )
    p.add_argument("--grace", type=float, default=10.0, metavar="S", help="on shutdown, seconds running turns get to finish (default 10)")
    p.add_argument("--events", metavar="PATH", help="append the scheduling events to this JSON-lines file")
    p.add_argument(
        "--log-prompts", metavar="PATH", help="append each request's prompt and completion to this JSON-lines file (off by default)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpu.engine import open_engine
    from gpu.model.fetch import resolve_model
    from swarm.server import listen

    if args.slots < 1:
        raise ConfigError(f"--slots must be at least 1, got {args.slots}")
    with listen(args.host, args.port) as sock:  # a port in use is an error now, not after the model loads
        path = resolve_model(args.model)
        model_id = args.served_model_name or Path(path).name.removesuffix(".gguf")
        engine = open_engine(path, args.device, kernels=args.kernels)
        try:
            anyio.run(_serve, engine, model_id, args, sock)
        except KeyboardInterrupt:
            return 130
    return 0


async def _serve(engine, model_id: str, args: argparse.Namespace, sock: socket.socket) -> None:
    from swarm.api import Swarm
    from swarm.server import serve

    async with Swarm(
        engine,
        slots=args.slots,
        policy=args.policy,
        step_tokens=args.step_tokens,
        shaping=not args.no_shaping,
        speculate=args.speculate,
        events=args.events,
        model_name=model_id,
    ) as swarm:
        async with anyio.create_task_group() as tg:
            handle = await tg.start(
                lambda task_status: serve(
                    swarm,
                    model_id=model_id,
                    host=args.host,
                    port=args.port,
                    api_key=args.api_key,
                    max_queue=args.max_queue,
                    grace_s=args.grace,
                    log_prompts=args.log_prompts,
                    sock=sock,
                    task_status=task_status,
                )
            )
            print(f"serving {model_id!r} at {handle.url}/v1 ({args.slots} slots, {swarm.config.policy.value}); Ctrl-C stops", flush=True)
    print("stopped", file=sys.stderr, flush=True)
