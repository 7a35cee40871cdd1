"""The `mlxcel` command: generate, serve, profiles, bench.

A subcommand's module is imported only when that subcommand runs (all of them for `mlxcel
--help`): generate and serve pull in MLX and mlx-lm, seconds that `mlxcel profiles` and
`mlxcel bench` need not pay.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import signal
import sys
from collections.abc import Sequence

from app import __version__
from app.loading import ModelLoadError
from app.profiles import ProfileError

EXIT_USAGE = 2
COMMANDS = ("generate", "serve", "profiles", "bench")  # each is the module app.cli.<name>


def build_parser(commands: Sequence[str] = COMMANDS) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False, prog="mlxcel", description="Speculative decoding on MLX.")
    parser.add_argument("--version", action="version", version=f"mlxcel {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in commands:
        importlib.import_module(f"app.cli.{name}").add_parser(subparsers)
    return parser


def parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """The arguments; one a subcommand does not know is refused by that subcommand, so the usage
    printed is its own (`mlxcel serve ...`), with the nearest flag it has where one is close."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        sub = subcommand(parser, args.command)
        known = [option for action in sub._actions for option in action.option_strings]
        flag = next((word.split("=", 1)[0] for word in unknown if word.startswith("-")), "")
        close = difflib.get_close_matches(flag, known, n=1, cutoff=0.75) if flag else []
        hint = f" (did you mean {close[0]}?)" if close else ""
        sub.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
    return args


def subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--version"]:  # answered before any subcommand module (and MLX) is imported
        named: Sequence[str] = ()
    else:  # help and usage errors list them all
        named = argv[:1] if argv[:1] and argv[0] in COMMANDS else COMMANDS
    try:
        args = parse(build_parser(named), argv)
        return args.handler(args)
    except KeyboardInterrupt:  # Ctrl-C before the command handles it (serve does from its first line)
        return 128 + signal.SIGINT  # the shell's status for it, without a traceback
    except (ModelLoadError, ProfileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader left (`mlxcel profiles show | head -1`): end quietly, as a process SIGPIPE
        # killed would; stdout goes to /dev/null so the flush at exit cannot raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
