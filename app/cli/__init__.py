"""The `mlxcel` command: generate, serve, profiles, bench."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from app.cli import bench, generate, profiles, serve
from app.loading import ModelLoadError
from app.profiles import ProfileError

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mlxcel", description="Speculative decoding on MLX.")
    commands = parser.add_subparsers(dest="command", required=True)
    generate.add_parser(commands)
    serve.add_parser(commands)
    profiles.add_parser(commands)
    bench.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (ModelLoadError, ProfileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
