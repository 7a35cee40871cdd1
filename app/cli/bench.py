"""`mlxcel bench`: run the benchmarks in ops/bench; with --write, update docs/benchmarks.md.

Each suite prints its table on stdout and, when stderr is a terminal, its progress there."""

from __future__ import annotations

import argparse
import importlib
import sys

from app.loading.paths import REPO_ROOT

SUITES = ("speculative", "server", "concurrency", "prompt_cache", "quantized")


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "bench", allow_abbrev=False, help="run ops/bench benchmarks (docs/benchmarks.md only with --write)"
    )
    p.add_argument("suite", nargs="?", choices=[*SUITES, "all"], default="all", help="which benchmark (default: all)")
    p.add_argument("--write", action="store_true", help="write each suite's section of docs/benchmarks.md")
    p.add_argument("options", nargs=argparse.REMAINDER, help="passed to the suite (e.g. --tokens 64 --repeats 1)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if not (REPO_ROOT / "ops" / "bench").is_dir():
        print("error: the benchmarks live in the repository checkout (ops/bench)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(REPO_ROOT))
    for suite in SUITES if args.suite == "all" else (args.suite,):
        importlib.import_module(f"ops.bench.{suite}").main([*args.options, *(["--write"] if args.write else [])])
    return 0
