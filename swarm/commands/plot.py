"""`swarm plot`: a picture of a session (slot timeline) or of bench results."""

from __future__ import annotations

import argparse

from swarm.viewers import plot


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plot",
        help="draw a slot timeline from an events file, or wait distributions from bench results",
        description=(
            "PATH is an events file (JSON lines, from a swarm's event log) or bench results "
            "(from `swarm bench swarm --json` or `swarm sim --json`); which one is told by its content. "
            "The picture's format follows the extension of -o (png, svg, pdf)."
        ),
    )
    parser.add_argument("path", metavar="PATH", help="events .jsonl or bench results .json")
    parser.add_argument("-o", "--output", metavar="OUT", help="where to write the picture (default: PATH with .png)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = plot.plot_file(args.path, args.output)
    print(f"wrote {out}")
    return 0
