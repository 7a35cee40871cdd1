"""`mlxcel bench`: run the benchmarks in ops/bench and update docs/benchmarks.md."""

from __future__ import annotations

import argparse
import importlib
import sys

from app.loading.paths import REPO_ROOT

SUITES = ("speculative", "server", "concurrency", "prompt_cache")


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("bench", help="run ops/bench benchmarks (writes docs/benchmarks.md)")
    p.add_argument("suite", nargs="?", choices=[*SUITES, "all"], default="all")
    p.add_argument("options", nargs=argparse.REMAINDER, help="passed to the suite (e.g. --tokens 64 --no-write)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if not (REPO_ROOT / "ops" / "bench").is_dir():
        print("error: the benchmarks live in the repository checkout (ops/bench)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(REPO_ROOT))
    for suite in SUITES if args.suite == "all" else (args.suite,):
        importlib.import_module(f"ops.bench.{suite}").main(args.options)
    return 0
