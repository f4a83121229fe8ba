"""`swarm models`: the model catalogue, what of it is cached, and fetching.

    swarm models                               # the catalogue and the cache
    swarm models --fetch qwen2.5-coder-0.5b    # fetch (checked, resumable) if not cached
    swarm models --hollow smollm2-135m FILE    # its twin with zeroed weights, for timing elsewhere (gpu.model.hollow)

Any command's --model takes a catalogue name, a GGUF path or hf:OWNER/REPO/FILE.
"""

from __future__ import annotations

import argparse

from runtime.errors import ConfigError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("models", help="list the model catalogue and the cache; fetch a model", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--fetch", nargs="+", metavar="NAME", help="fetch these catalogue models into the cache")
    p.add_argument("--hollow", nargs=2, metavar=("MODEL", "FILE"),
                   help="write MODEL's hollow twin to FILE: its shapes, types and tokenizer, "
                        "every weight zero (timing does not depend on them)")  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpu.model.catalogue import CATALOGUE, DEFAULT_MODEL
    from gpu.model.fetch import cache_dir, cached, fetch, unknown_model

    if args.hollow:
        return write_hollow(*args.hollow)

    for name in args.fetch or ():
        if name not in CATALOGUE:
            raise ConfigError(unknown_model(name))
        fetch(CATALOGUE[name], cache_dir())
    print(f"model cache: {cache_dir()}")
    for name, entry in CATALOGUE.items():
        path = cached(entry)
        default = " (default)" if name == DEFAULT_MODEL else ""
        print(f"\n{name}{default}: {entry.title}, {entry.size / 1e6:,.0f} MB in {len(entry.parts)} part(s)")
        print(f"    {entry.about}")
        print(f"    cached: {path}" if path else f"    not cached (swarm models --fetch {name})")
    return 0


def write_hollow(model: str, file: str) -> int:
    from pathlib import Path

    from gpu.model.fetch import resolve_model
    from gpu.model.hollow import write_hollow as write

    source, target = resolve_model(model), Path(file)
    if target.exists() and target.resolve() == source.resolve():
        raise ConfigError(f"{file} is the model itself: name another file for its hollow twin")
    kept = write(source, target)
    print(
        f"{target}: the hollow twin of {source.name}, "
        f"{source.stat().st_size / 1e6:.0f} MB with {kept / 1e6:.1f} MB of header, the rest zeros"
    )
    return 0
