"""One tick of B rows: the project's exact `forward(rows)`, its fast path, and mlx-lm's own step.

For B rows at width 1 (decode) and 5 (verify), each row at its own length (prompts of 100 to
250 tokens), after `--warm` unmeasured ticks: the project's exact tick (forward + evaluation, and
of that the host's build of the graph before evaluation starts), the fast path's tick
(`execution.exact = false`: the same pool and tick through MLX's own kernels), and mlx-lm's own
batched step on an untouched `mlx_lm.load` copy of the checkpoint (one `[B, w]` call on a
plain `KVCache` batch of 200 positions), for the checkpoint and a 4-bit copy (`mlx_lm convert
-q`). Medians over `--repeats` ticks; the rows are rewound after each. On the CPU it also reports
the BLAS shim's row-stable kernel's share of the exact tick (app/runtime/sgemm_rows.c).

`--profile` then times, part by part, the exact tick of every cell that loses to mlx-lm's step
(exact / mlx-lm above 1): the host's build, the evaluation, and the tick again with the attention
left out, with the pool's scatter also left out, and with MLX's own products instead of the
row-invariant ones. The differences are what each part costs in that tick.

    python -m ops.bench.tick [--target DIR | random-1.2b | grown-1.2b] [--rows 1,4,16] [--widths 1,5]
        [--repeats 12] [--no-quantized] [--profile] [--write]

The issue's table (issue 35) is `--target random-1.2b` on the H200; issue 46's is `--target
grown-1.2b` (ops/models/grown.py: the embedded target grown to 1.2 B, the same function).
"""

from __future__ import annotations

# isort: off
from ops.bench.common import WRITE_HELP, machine, section_name, table, write_section  # first: sets up MLX's BLAS

# isort: on
import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from app.execution import attention, row_invariant
from app.execution.device import backend, compute_dtype
from app.execution.forward import RowForward, forward
from app.execution.model import load_model
from app.execution.prepare import prepared
from app.execution.runner import ModelRunner
from app.loading import read_checkpoint
from app.runtime.blas import product_seconds, time_products
from ops.bench.spawn import REPO_ROOT
from ops.models.grown import GROWN_1_2B, build_grown_1_2b, quantized_copy
from ops.models.random_target import SIZE_1_2B, build_random_target

RANDOM_1_2B = "random-1.2b"
EMBEDDED_TARGET = REPO_ROOT / "models" / "target"
PLAIN_LENGTH = 200  # mlx-lm's batch: every row at this many positions


def ticks(
    step: Callable[[list[list[int]]], list[mx.array]],
    after: Callable[[int], None],
    rows: int,
    width: int,
    args: argparse.Namespace,
) -> dict[str, float]:
    """Median ms of the whole tick and of the host's build (before evaluation), and the shim's
    share of the tick where it runs."""
    rng = np.random.default_rng(1)
    whole, built, shares = [], [], []
    for repeat in range(args.warm + args.repeats):
        tokens = [rng.integers(4, 4000, size=width).tolist() for _ in range(rows)]
        timing = time_products(True)
        started = time.perf_counter()
        logits = step(tokens)
        ready = time.perf_counter()
        mx.eval(logits)
        done = time.perf_counter()
        if repeat >= args.warm:
            whole.append(done - started)
            built.append(ready - started)
            if timing:
                shares.append(product_seconds() / (done - started))
        after(width)
    time_products(False)
    result = {"tick": 1e3 * statistics.median(whole), "host": 1e3 * statistics.median(built)}
    if shares:
        result["products"] = statistics.median(shares)
    return result


def project(
    model: nn.Module, rows: int, width: int, args: argparse.Namespace
) -> tuple[dict[str, float], list[ModelRunner]]:
    rng = np.random.default_rng(0)
    runners = [ModelRunner(model) for _ in range(rows)]
    for runner in runners:
        mx.eval(runner.prefill(rng.integers(4, 4000, size=int(rng.integers(100, 250))).tolist()))

    def step(tokens: list[list[int]]) -> list[mx.array]:
        return forward([RowForward(r, t) for r, t in zip(runners, tokens, strict=True)])

    def rewind(width: int) -> None:
        for runner in runners:
            runner.rewind(width)

    return ticks(step, rewind, rows, width, args), runners


def plain_step(model: nn.Module, rows: int, width: int, args: argparse.Namespace) -> dict[str, float]:
    """mlx-lm's own batched step: one `[B, w]` call on a plain KVCache batch."""
    rng = np.random.default_rng(0)
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array(rng.integers(4, 4000, size=(rows, PLAIN_LENGTH))), cache=cache))

    def step(tokens: list[list[int]]) -> list[mx.array]:
        return [model(mx.array(tokens), cache=cache)]

    def trim(width: int) -> None:
        for c in cache:
            c.trim(width)

    return ticks(step, trim, rows, width, args)


@contextmanager
def patched(target: object, name: str, value: object) -> Iterator[None]:
    original = getattr(target, name)
    setattr(target, name, value)
    try:
        yield
    finally:
        setattr(target, name, original)


def profile(model: nn.Module, rows: int, width: int, args: argparse.Namespace) -> dict[str, float]:
    """One exact tick part by part (see the module's docstring), ms: the whole tick, the host's
    build, the evaluation, and what the attention, the pool's scatter and the row-invariant
    products (over MLX's own) add to it."""
    measured, runners = project(model, rows, width, args)

    def again() -> float:
        prepared(model).ticks.clear()  # a compiled tick would replay what it traced before the patch
        result, _ = project(model, rows, width, args)
        prepared(model).ticks.clear()
        return result["tick"]

    with patched(attention.PoolLayer, "attend", lambda self, queries, scale, mask, sinks: queries):
        no_attention = again()
        with patched(attention.PoolLayer, "update_and_fetch", lambda self, keys, values: (self.keys, self.values)):
            no_scatter = again()
    with patched(row_invariant, "_active", lambda: False):
        mlx_products = again()
    del runners
    whole = measured["tick"]
    return {
        "whole": whole,
        "host": measured["host"],
        "evaluation": whole - measured["host"],
        "attention": whole - no_attention,
        "scatter": no_attention - no_scatter,
        "products": whole - mlx_products,
    }


PARTS_HEADER = ["weights", "rows", "width", "exact / mlx-lm", "whole tick ms", "host build ms", "evaluation ms",
                "attention ms", "pool's scatter ms", "row-invariant products over MLX's ms"]  # fmt: skip


def parts_row(name: str, rows: int, width: int, lost: float, parts: dict[str, float]) -> list[str]:
    measured = [f"{parts[key]:.2f}" for key in ("whole", "host", "evaluation")]
    differences = [f"{parts[key]:+.2f}" for key in ("attention", "scatter", "products")]
    return [name, str(rows), str(width), f"{lost:.2f}x", *measured, *differences]


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument(
        "--target", default=str(EMBEDDED_TARGET), help=f"a model directory, {RANDOM_1_2B} or {GROWN_1_2B}"
    )
    parser.add_argument("--rows", default="1,4,16")
    parser.add_argument("--widths", default="1,5")
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--warm", type=int, default=3, help="unmeasured ticks first (compiles each shape)")
    parser.add_argument("--no-quantized", action="store_true", help="skip the 4-bit copy")
    parser.add_argument(
        "--profile", action="store_true", help="also time part by part each tick slower than mlx-lm's step"
    )
    parser.add_argument("--write", action="store_true", help=WRITE_HELP)
    args = parser.parse_args()
    rows, widths = [int(r) for r in args.rows.split(",")], [int(w) for w in args.widths.split(",")]
    with tempfile.TemporaryDirectory() as scratch:
        target = Path(args.target)
        if args.target == RANDOM_1_2B:
            target = build_random_target(Path(scratch) / RANDOM_1_2B, **SIZE_1_2B)
        elif args.target == GROWN_1_2B:
            target = build_grown_1_2b(Path(scratch) / GROWN_1_2B, drafters=False).target
        variants = [("checkpoint", target)]
        if not args.no_quantized:
            variants.append(("4-bit", quantized_copy(target, Path(scratch) / f"{target.name}-4bit")))
        body = report(variants, rows, widths, args)
    print(body)
    if args.write:
        write_section(section_name("tick", args.target), body)


def report(variants: list[tuple[str, Path]], rows: list[int], widths: list[int], args: argparse.Namespace) -> str:
    cpu = not backend().gpu
    header = ["weights", "rows", "width", "exact tick ms", "host build ms (share)", "fast path ms", "mlx-lm step ms"]
    header += ["exact / mlx-lm", "exact / fast"] + (["row-stable kernel's share"] if cpu else [])
    lines, profiles = [], []
    for name, path in variants:
        exact, fast = load_model(path).model, load_model(path, exact=False).model
        plain = mlx_lm.load(str(path))[0]  # mlx-lm's own modules and kernels, untouched
        dtype = compute_dtype(plain, read_checkpoint(path).config, "auto")
        if dtype is not None:  # the CPU computes small models in float32: both sides do
            plain.set_dtype(dtype)
        for b in rows:
            for w in widths:
                ours, _ = project(exact, b, w, args)
                quick, _ = project(fast, b, w, args)
                theirs = plain_step(plain, b, w, args)
                line = [
                    name,
                    str(b),
                    str(w),
                    f"{ours['tick']:.2f}",
                    f"{ours['host']:.2f} ({ours['host'] / ours['tick']:.0%})",
                ]
                line += [f"{quick['tick']:.2f}", f"{theirs['tick']:.2f}"]
                line += [f"{ours['tick'] / theirs['tick']:.2f}x", f"{ours['tick'] / quick['tick']:.2f}x"]
                line += [f"{ours['products']:.0%}"] if cpu and "products" in ours else ([] if not cpu else ["-"])
                lines.append(line)
                print(" | ".join(line), flush=True)
                if args.profile and ours["tick"] > theirs["tick"]:  # a losing cell: where its time goes
                    parts = profile(exact, b, w, args)
                    profiles.append(parts_row(name, b, w, ours["tick"] / theirs["tick"], parts))
                    print(" | ".join(profiles[-1]), flush=True)
    target = args.target if args.target in (RANDOM_1_2B, GROWN_1_2B) else variants[0][1].name
    body = [
        "### One tick: the exact path, the fast path and mlx-lm's own step (`python -m ops.bench.tick`)",
        "",
        f"{machine()}. Target `{target}`; rows at 100 to 250 cached positions (mlx-lm's batch: {PLAIN_LENGTH});"
        f" medians of {args.repeats} ticks after {args.warm} unmeasured ones.",
        "",
        table(header, lines),
    ]
    if args.profile:
        intro = (
            "Each exact tick slower than mlx-lm's step, part by part (ms; the attention, the pool's scatter and "
            "the products by time differences: the tick again without each, or with MLX's own products):"
        )
        none = "(none: every exact tick was at most mlx-lm's step)"
        body += ["", intro, "", table(PARTS_HEADER, profiles) if profiles else none]
    return "\n".join(body)


if __name__ == "__main__":
    main()
