"""The `mlxcel` command: generate, serve, profiles, bench."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from app.cli import generate, profiles, serve
from app.loading import ModelLoadError
from app.profiles import ProfileError

EXIT_USAGE = 2


def not_yet(name: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    parser.set_defaults(handler=lambda _args: _unavailable(name))
    return parser


def _unavailable(name: str) -> int:
    print(f"mlxcel {name}: not yet available", file=sys.stderr)
    return EXIT_USAGE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mlxcel", description="Speculative decoding on MLX.")
    commands = parser.add_subparsers(dest="command", required=True)
    generate.add_parser(commands)
    serve.add_parser(commands)
    profiles.add_parser(commands)
    for name in ("bench",):
        commands.add_parser(name, parents=[not_yet(name)], help="not yet available")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (ModelLoadError, ProfileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
