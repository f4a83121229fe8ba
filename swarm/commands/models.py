"""`swarm models`: the model catalogue, what of it is cached, and fetching.

    swarm models                               # the catalogue and the cache
    swarm models --fetch qwen2.5-coder-0.5b    # fetch (checked, resumable) if not cached

Any command's --model takes a catalogue name, a GGUF path or hf:OWNER/REPO/FILE.
"""

from __future__ import annotations

import argparse

from runtime.errors import ConfigError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("models", help="list the model catalogue and the cache; fetch a model", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--fetch", nargs="+", metavar="NAME", help="fetch these catalogue models into the cache")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpu.catalogue import CATALOGUE, DEFAULT_MODEL
    from gpu.fetch import cache_dir, cached, fetch

    for name in args.fetch or ():
        if name not in CATALOGUE:
            raise ConfigError(f"no catalogue model {name!r} (have: {', '.join(CATALOGUE)})")
        fetch(CATALOGUE[name], cache_dir())
    print(f"model cache: {cache_dir()}")
    for name, entry in CATALOGUE.items():
        path = cached(entry)
        default = " (default)" if name == DEFAULT_MODEL else ""
        print(f"\n{name}{default}: {entry.title}, {entry.size / 1e6:,.0f} MB in {len(entry.parts)} part(s)")
        print(f"    {entry.about}")
        print(f"    cached: {path}" if path else f"    not cached (swarm models --fetch {name})")
    return 0
