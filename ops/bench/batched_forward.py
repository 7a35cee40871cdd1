"""One flattened forward of B rows (`forward`) against the same B rows' solo forwards.

Rows sit at different cache lengths (prompts of 100 to 250 tokens); each repeat times both arms
back to back (the machine is shared and noisy), evaluating all B rows' logits at once, then
rewinds the rows. Prints median milliseconds per tick and the ratio, and checks the two arms'
logits are bit-identical.

    python -m ops.bench.batched_forward [--role target|drafter] [--repeats 15]
"""

from __future__ import annotations

# isort: off
from ops.bench.common import machine  # first: sets up MLX's BLAS

# isort: on
import argparse
import statistics
import time
from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from app.execution.forward import RowForward, forward
from app.execution.model import load_model
from app.execution.runner import ModelRunner
from app.loading import EMBEDDED_DRAFTER, EMBEDDED_TARGET
from app.runtime.blas import row_stable_rows

ROWS = (1, 2, 4, 8, 16)
WIDTHS = (1, 5)


def timed(step: Callable[[list[list[int]]], list[mx.array]], inputs: list[list[int]]) -> tuple[float, list[np.ndarray]]:
    start = time.perf_counter()
    logits = step(inputs)
    mx.eval(logits)
    return (time.perf_counter() - start) * 1e3, [np.array(x) for x in logits]


def measure(
    model: nn.Module, rows: int, width: int, repeats: int, rng: np.random.Generator
) -> tuple[float, float, bool]:
    prompts = [rng.integers(4, 4000, size=int(rng.integers(100, 250))).tolist() for _ in range(rows)]
    solo, batched = [ModelRunner(model) for _ in prompts], [ModelRunner(model) for _ in prompts]
    for runner, prompt in [*zip(solo, prompts, strict=True), *zip(batched, prompts, strict=True)]:
        mx.eval(runner.prefill(prompt))
    solo_ms, batched_ms, exact = [], [], True
    for _ in range(repeats):
        inputs = [rng.integers(4, 4000, size=width).tolist() for _ in range(rows)]
        ms, want = timed(lambda tokens: [r.forward(t) for r, t in zip(solo, tokens, strict=True)], inputs)
        solo_ms.append(ms)
        ms, got = timed(
            lambda tokens: forward([RowForward(r, t) for r, t in zip(batched, tokens, strict=True)]), inputs
        )
        batched_ms.append(ms)
        exact &= all(np.array_equal(a, b) for a, b in zip(want, got, strict=True))
        for runner in [*solo, *batched]:
            runner.rewind(width)
    return statistics.median(solo_ms), statistics.median(batched_ms), exact


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["target", "drafter"], default="target")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    model = load_model(EMBEDDED_TARGET if args.role == "target" else EMBEDDED_DRAFTER).model
    rng = np.random.default_rng(0)
    print(f"{args.role}, {machine()}, row-stable products up to {row_stable_rows()} rows")
    print("| rows | width | B solo forwards (ms) | one batched forward (ms) | speed-up | bit-identical |")
    print("|---|---|---|---|---|---|")
    for width in WIDTHS:
        for rows in ROWS:
            solo, batched, exact = measure(model, rows, width, args.repeats, rng)
            verdict = "yes" if exact else "NO"
            print(f"| {rows} | {width} | {solo:.1f} | {batched:.1f} | {solo / batched:.2f}x | {verdict} |")


if __name__ == "__main__":
    main()
