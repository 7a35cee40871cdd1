"""The first request after `/health` turns 200, against warm ones, with and without the warm-up.

For each profile and `server.warmup` setting, starts `mlxcel serve` (on the embedded pair or
`--target`), waits for `/health` 200 (timing that), then sends the same streamed request (T = 0,
a fixed token count, EOS ignored) `--repeats` + 1 times in a row: the first is the cold one.
The goal (issue 25): the first request within 2x the time of a warm one.

    python -m ops.bench.cold_start [--profiles target-only,default] [--warmup on,off]
        [--tokens 64] [--repeats 3] [--target DIR | random-1.2b | grown-1.2b] [--write]

Each profile keeps its drafter on another target (ops/bench/concurrency.py `Target`).
"""

from __future__ import annotations

# isort: off
from ops.bench.common import WRITE_HELP, machine, section_name, table, write_section  # first: sets up MLX's BLAS

# isort: on
import argparse
import statistics
import tempfile
import time
from pathlib import Path

from ops.bench.concurrency import RANDOM_1_2B, target_of
from ops.bench.prompts import HELD_OUT_CODE
from ops.bench.server import stream_over_http
from ops.bench.spawn import spawned_server
from ops.models.grown import GROWN_1_2B


def measure(profile: str, warmup: str, flags: list[str], tokens: int, repeats: int) -> list[str]:
    started = time.perf_counter()
    with spawned_server(profile, "stderr", flags, {"MLXCEL_SERVER__WARMUP": warmup}) as (url, _):
        ready = time.perf_counter() - started
        seconds = [stream_over_http(url, HELD_OUT_CODE[0], tokens)[1] for _ in range(repeats + 1)]
    warm = statistics.median(seconds[1:])
    return [profile, warmup, f"{ready:.1f}", f"{seconds[0]:.3f}", f"{warm:.3f}", f"{seconds[0] / warm:.2f}x"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profiles", type=lambda text: text.split(","), default=["target-only", "default"])
    parser.add_argument("--warmup", type=lambda text: text.split(","), default=["on", "off"])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="warm requests after the first")
    parser.add_argument(
        "--target", help=f"a model directory, {RANDOM_1_2B} or {GROWN_1_2B} (built first); default: the embedded"
    )
    parser.add_argument("--write", action="store_true", help=WRITE_HELP)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        target = target_of(args.target, Path(scratch))
        rows = [measure(p, w, target.flags(p), args.tokens, args.repeats) for p in args.profiles for w in args.warmup]
    header = [
        "profile",
        "server.warmup",
        "start to /health 200 (s)",
        "first request (s)",
        "warm (median, s)",
        "first / warm",
    ]
    body = "\n".join([
        f"## First request after startup (`ops/bench/cold_start.py`), {machine()}",
        "",
        f"Target: {args.target or target.directory.name}; {args.tokens} tokens a request, T = 0; "
        f"{args.repeats} warm requests after the first.",
        "",
        table(header, rows),
    ])  # fmt: skip
    print(body)
    if args.write:
        write_section(section_name("cold-start", args.target), body)


if __name__ == "__main__":
    main()
