"""One tick of B rows (`forward`) against the same B rows' solo forwards.

Rows sit at different cache lengths (prompts of 100 to 250 tokens); each repeat times both arms
back to back (the machine is shared and noisy), evaluating all B rows' logits at once, then
rewinds the rows. Prints median milliseconds per tick and the ratio, and checks the two arms'
logits are bit-identical.

`--kernel` times the raw matrix products instead: the shim's row-stable kernel against OpenBLAS's
`scipy_cblas_sgemm` (both single-threaded, called through ctypes, interleaved per repeat) on the
embedded target's and drafter's shapes, read from their configs: `x @ W.T` for every projection
and the lm_head, and attention's `q @ K.T` and `p @ V` over 256 cached positions. GFLOP/s are
medians; at one row a call is only microseconds, so ctypes' overhead weighs on both arms.

    python -m ops.bench.batched_forward [--role target|drafter] [--repeats 15] [--kernel]
"""

from __future__ import annotations

# isort: off
from ops.bench.common import machine  # first: sets up MLX's BLAS

# isort: on
import argparse
import ctypes
import json
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from app.execution.device import backend
from app.execution.forward import RowForward, forward
from app.execution.model import load_model
from app.execution.runner import ModelRunner
from app.loading import EMBEDDED_DRAFTER, EMBEDDED_TARGET
from app.runtime.blas import SHIM, row_stable_rows

ROWS = (1, 2, 4, 8, 16)
WIDTHS = (1, 5)
KERNEL_ROWS = (1, 8, 16, 32, 64)
CONTEXT = 256  # cached positions for the attention products
ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112


def timed(step: Callable[[list[list[int]]], list[mx.array]], inputs: list[list[int]]) -> tuple[float, list[mx.array]]:
    start = time.perf_counter()
    logits = step(inputs)
    mx.eval(logits)
    return (time.perf_counter() - start) * 1e3, logits


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
        exact &= all(mx.array_equal(a, b).item() for a, b in zip(want, got, strict=True))  # bf16 on the GPU
        for runner in [*solo, *batched]:
            runner.rewind(width)
    return statistics.median(solo_ms), statistics.median(batched_ms), exact


def product_shapes(config_dir: Path) -> dict[str, tuple[int, int, bool]]:
    """name -> (n, k, B transposed) of the products `[m, k] x op(B) -> [m, n]` of one model."""
    config = json.loads((config_dir / "config.json").read_text())
    hidden, head = config["hidden_size"], config["head_dim"]
    queries, keys = config["num_attention_heads"] * head, config["num_key_value_heads"] * head
    return {
        "q_proj": (queries, hidden, True),
        "k_proj, v_proj": (keys, hidden, True),
        "o_proj": (hidden, queries, True),
        "gate_proj, up_proj": (config["intermediate_size"], hidden, True),
        "down_proj": (hidden, config["intermediate_size"], True),
        "lm_head": (config["vocab_size"], hidden, True),
        f"q @ K.T ({CONTEXT} keys)": (CONTEXT, head, True),
        f"p @ V ({CONTEXT} keys)": (head, CONTEXT, False),
    }


def kernel_table(repeats: int) -> None:
    """GFLOP/s of the row-stable kernel and of OpenBLAS on the embedded models' product shapes."""
    shim = ctypes.CDLL(str(SHIM))
    ours, openblas = shim.mlxcel_row_stable_sgemm, shim.scipy_cblas_sgemm
    ours.restype = openblas.restype = None
    shapes = product_shapes(EMBEDDED_TARGET)
    drafter = product_shapes(EMBEDDED_DRAFTER)
    print(f"kernel, {machine()}, row-stable products up to {row_stable_rows()} rows")
    if drafter != shapes:
        shapes |= {f"drafter {name}": shape for name, shape in drafter.items()}
    else:
        print("(the drafter's shapes are the target's)")
    print("| product | n | k | rows | row-stable (GFLOP/s) | OpenBLAS (GFLOP/s) | ratio |")
    print("|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for name, (n, k, transposed) in shapes.items():
        b = rng.standard_normal((n, k) if transposed else (k, n), dtype=np.float32)
        for m in KERNEL_ROWS:
            a = rng.standard_normal((m, k), dtype=np.float32)
            c = np.zeros((m, n), dtype=np.float32)
            args = (
                NO_TRANS, TRANS if transposed else NO_TRANS, m, n, k, ctypes.c_float(1.0),
                a.ctypes.data_as(ctypes.c_void_p), k, b.ctypes.data_as(ctypes.c_void_p), k if transposed else n,
                ctypes.c_float(0.0), c.ctypes.data_as(ctypes.c_void_p), n,
            )  # fmt: skip
            calls = max(3, int(2e7 / (2 * m * n * k)))  # about 1 ms of work per sample
            arms = {"ours": partial(ours, *args), "openblas": partial(openblas, ROW_MAJOR, *args)}
            seconds: dict[str, list[float]] = {arm: [] for arm in arms}
            for _ in range(repeats):  # interleaved: both arms see the same machine state
                for arm, call in arms.items():
                    start = time.perf_counter()
                    for _ in range(calls):
                        call()
                    seconds[arm].append((time.perf_counter() - start) / calls)
            flops = 2 * m * n * k
            ours_g, openblas_g = (flops / statistics.median(seconds[arm]) / 1e9 for arm in ("ours", "openblas"))
            print(f"| {name} | {n} | {k} | {m} | {ours_g:.1f} | {openblas_g:.1f} | {ours_g / openblas_g:.0%} |")


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["target", "drafter"], default="target")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--kernel", action="store_true", help="time the raw matrix products (see above)")
    args = parser.parse_args()
    if args.kernel:
        kernel_table(args.repeats)
        return
    model = load_model(EMBEDDED_TARGET if args.role == "target" else EMBEDDED_DRAFTER).model
    rng = np.random.default_rng(0)
    print(f"{args.role}, {machine()}, row-stable products up to {backend().row_stable_rows} rows")
    print("| rows | width | B solo forwards (ms) | one batched forward (ms) | speed-up | bit-identical |")
    print("|---|---|---|---|---|---|")
    for width in WIDTHS:
        for rows in ROWS:
            solo, batched, exact = measure(model, rows, width, args.repeats, rng)
            verdict = "yes" if exact else "NO"
            print(f"| {rows} | {width} | {solo:.1f} | {batched:.1f} | {solo / batched:.2f}x | {verdict} |")


if __name__ == "__main__":
    main()
