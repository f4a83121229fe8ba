"""The `swarm` command line. Each subcommand lives in its own module under
`swarm/commands/` with two functions: `add_parser(subparsers)` and `run(args) -> int`.

Exit codes: 0 done, 1 a runtime failure (one line on stderr saying what), 2 a usage
error (a bad flag, value or file), 130 interrupted."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import sys

from runtime.errors import ConfigError, SlotswarmError, UsageError

COMMANDS = ["run", "sim", "bench", "generate", "tail", "plot", "serve", "watch", "models"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="swarm", description="slotswarm: local LLM agent swarms in which the turn a person watches never waits behind background work."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"swarm.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"swarm.commands.{name}":
                raise
            continue  # not built yet
        module.add_parser(sub)
    _show_defaults(parser)
    return parser


class _ShowsDefaults(argparse.HelpFormatter):
    """Ends a flag's help with its default, unless the help already says it (or
    there is none to say)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        silent = action.default in (None, False, argparse.SUPPRESS) or not action.option_strings
        if silent or "default" in text or isinstance(action, argparse._VersionAction):
            return text
        return f"{text} (default: %(default)s)"


def _show_defaults(parser: argparse.ArgumentParser) -> None:
    """Every command's and subcommand's help, in the formatter its module chose."""
    if not issubclass(parser.formatter_class, _ShowsDefaults):
        parser.formatter_class = type(f"ShowsDefaults{parser.formatter_class.__name__}", (_ShowsDefaults, parser.formatter_class), {})
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _show_defaults(child)


def _version() -> str:
    try:
        return importlib.metadata.version("slotswarm")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        try:
            return args.func(args) or 0
        except BaseExceptionGroup as group:
            # An error raised inside a task group arrives wrapped: alone, it is
            # handled below as itself, so it is one line and its exit code too.
            alone = _alone(group)
            if alone is group:
                raise
            raise alone from None
    except (ConfigError, UsageError) as exc:
        print(f"swarm {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except SlotswarmError as exc:
        print(f"swarm {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`swarm tail | head`): not an error of ours.
        # Point stdout at devnull so the interpreter's final flush stays quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:  # a file that cannot be read or written, a socket refused
        print(f"swarm {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 1


def _alone(group: BaseExceptionGroup) -> BaseException:
    """The one error inside `group` (and its nested groups), or the group itself
    when it holds several."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return group if isinstance(exc, BaseExceptionGroup) else exc


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 400 else text[:397] + "..."


if __name__ == "__main__":
    sys.exit(main())
