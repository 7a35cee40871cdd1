"""The tensor-core row-invariant product (app/runtime/row_mma.cu, issue 48) against the row kernel.

In one process, on an NVIDIA GPU (on any other machine it says so and exits 0):

1. invariance: for the 1.2 B target's shapes (K x N: 2048 x 2048, 2048 x 6144 gate/up joined,
   6144 x 2048, 2048 x 151936 lm_head) and the embedded target's (256 x 256, 256 x 1024,
   1024 x 256), in bf16 and fp16 (bf16 alone for the lm_head) and (with `--quantized`) affine 4-
   and 8-bit of three of them: row i of the M-row product equals, bit for bit, the 1-row product
   of row i, for M in 1, 2, 3, 5, 8, 16, 17, 33, 80, 128, and the product of the rows shuffled;
   and q/k/v's three outputs of one call equal their own products;
2. accuracy: the largest error against a float32 product of the same inputs, over the output's
   root mean square, for the MMA kernel, the row kernel and MLX's own (cuBLAS);
3. timing: microseconds per product for M in 1, 4, 5, 16, 20, 80 of the row kernel, the MMA
   kernel and `x @ w.T`, each the median of `--samples` evaluations of `--batch` independent
   products (one evaluation of many: what a compiled tick does), after warm-up.

    python -m ops.bench.row_mma [--quick] [--quantized] [--tiles] [--samples 15] [--batch 20]

`--tiles` also times the MMA kernel's block tilings (row tiles x column tiles x column warps), which
change no bit: a row's sum order is K's chunks over KSPLIT warps alone.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import traceback
from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn

from app.execution import row_invariant
from app.execution.device import backend

TARGET_SHAPES = [(2048, 2048), (2048, 6144), (6144, 2048), (2048, 151936)]
EMBEDDED_SHAPES = [(256, 256), (256, 1024), (1024, 256)]
QUANTIZED_SHAPES = [(2048, 6144), (6144, 2048), (256, 1024)]
INVARIANCE_ROWS = (1, 2, 3, 5, 8, 16, 17, 33, 80, 128)
TIMING_ROWS = (1, 4, 5, 16, 20, 80)
# (row tiles, column tiles, column warps); blocks of KSPLIT x column warps <= 512 threads
TILINGS = (
    (1, 1, 1),
    (1, 2, 1),
    (1, 4, 1),
    (1, 1, 2),
    (1, 2, 2),
    (2, 2, 1),
    (2, 2, 2),
    (4, 2, 1),
    (4, 4, 1),
    (8, 1, 1),
    (8, 2, 1),
)
Product = Callable[[mx.array], mx.array]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--quick", action="store_true", help="fewer shapes (no lm_head)")
    parser.add_argument("--quantized", action="store_true", help="also the affine 4- and 8-bit kernel")
    parser.add_argument("--tiles", action="store_true", help="also time the MMA block tilings")
    parser.add_argument("--no-invariance", action="store_true")
    parser.add_argument("--no-timing", action="store_true")
    parser.add_argument("--bf16-only", action="store_true", help="invariance in bf16 alone (fewer compiles)")
    parser.add_argument("--samples", type=int, default=15)
    parser.add_argument("--batch", type=int, default=20)
    args = parser.parse_args()
    if not backend().row_invariant_kernels:
        print(f"row_mma: the kernels run on an NVIDIA GPU only (MLX computes on {backend().name} here): nothing to do")
        return 0
    print(f"device: {mx.device_info() if hasattr(mx, 'device_info') else mx.default_device()}", flush=True)
    shapes = TARGET_SHAPES[:3] if args.quick else TARGET_SHAPES
    failures = 0
    started = time.perf_counter()
    failures += guarded("smoke", smoke)
    if not args.no_invariance:
        dtypes = (mx.bfloat16,) if args.bf16_only else (mx.bfloat16, mx.float16)
        failures += guarded("invariance", lambda: invariance(shapes + EMBEDDED_SHAPES, args.quantized, dtypes))
    if not args.no_timing:
        failures += guarded("timing", lambda: timing(shapes, args))
        if args.tiles:
            failures += guarded("tilings", lambda: tilings(args))
    print(f"\nrow_mma: {failures} failing part(s), {time.perf_counter() - started:.1f} s", flush=True)
    return 1 if failures else 0


def guarded(name: str, part: Callable[[], int]) -> int:
    """Run one part; an exception is printed whole and counted, and the next part still runs."""
    try:
        return part()
    except Exception:
        print(f"\n!! {name} raised:", flush=True)
        traceback.print_exc()
        sys.stderr.flush()
        return 1


def smoke() -> int:
    """One small product of each kernel against float32: the first compile, its error shown early."""
    for dtype in (mx.bfloat16, mx.float16):
        x, weight = dense(256, 64, dtype, seed=1)
        exact = x[:16].astype(mx.float32) @ weight.astype(mx.float32).T
        for mma in (False, True):
            y = row_invariant.row_matmul(x[:16], weight, mma=mma)
            error = (y.astype(mx.float32) - exact).abs().max().item()
            size = exact.abs().max().item()
            print(f"  smoke {dtype} {'mma' if mma else 'row'}: max |error| {error:.3g} (outputs up to {size:.3g})")
    return 0


def dense(k: int, n: int, dtype: mx.Dtype, seed: int) -> tuple[mx.array, mx.array]:
    key = mx.random.key(seed)
    kx, kw = mx.random.split(key)
    weight = (mx.random.normal((n, k), key=kw) * (k**-0.5)).astype(dtype)
    x = mx.random.normal((max(INVARIANCE_ROWS), k), key=kx).astype(dtype)
    mx.eval(weight, x)
    return x, weight


def quantized_layer(weight: mx.array, bits: int) -> nn.QuantizedLinear:
    n, k = weight.shape
    layer = nn.QuantizedLinear(k, n, bias=False, group_size=64, bits=bits)
    q, scales, biases = mx.quantize(weight, group_size=64, bits=bits)
    layer.update({"weight": q, "scales": scales.astype(weight.dtype), "biases": biases.astype(weight.dtype)})
    mx.eval(layer.parameters())
    return layer


def kernels(weight: mx.array, layer: nn.QuantizedLinear | None) -> dict[str, Product]:
    if layer is None:
        return {
            "mma": lambda a: row_invariant.row_matmul(a, weight, mma=True),
            "row": lambda a: row_invariant.row_matmul(a, weight, mma=False),
        }
    return {
        "mma": lambda a: row_invariant.row_quantized_matmul(a, layer, mma=True),
        "row": lambda a: row_invariant.row_quantized_matmul(a, layer, mma=False),
    }


def invariance(shapes: list[tuple[int, int]], quantized: bool, dtypes: tuple[mx.Dtype, ...]) -> int:
    print("\n== invariance: row i of an M-row product against its 1-row product (bits), and accuracy", flush=True)
    print("   err = max |y - y_f32| / rms(y_f32), y_f32 a float32 product of the same (dequantized) inputs")
    failures = 0
    for k, n in shapes:
        for dtype in dtypes if n < 100_000 else (mx.bfloat16,):
            x, weight = dense(k, n, dtype, seed=k + n)
            variants: list[tuple[str, nn.QuantizedLinear | None]] = [("dense", None)]
            if quantized and dtype == mx.bfloat16 and (k, n) in QUANTIZED_SHAPES:
                variants += [(f"q{bits}", quantized_layer(weight, bits)) for bits in (4, 8)]
            for label, layer in variants:
                failures += check(k, n, dtype, label, x, weight, layer)
            mx.clear_cache()
    failures += guarded("siblings", siblings)
    return failures


def check(
    k: int, n: int, dtype: mx.Dtype, label: str, x: mx.array, weight: mx.array, layer: nn.QuantizedLinear | None
) -> int:
    name = f"{k:>5} x {n:<6} {str(dtype).split('.')[-1]:<8} {label:<5}"
    products = kernels(weight, layer)
    mma = products["mma"]
    rows = x.shape[0]
    single = mx.concatenate([mma(x[i : i + 1]) for i in range(rows)])
    mx.eval(single)
    bad: list[str] = []
    for m in INVARIANCE_ROWS:
        wide = mma(x[:m])
        if not mx.array_equal(wide, single[:m]).item():
            diff = (wide.astype(mx.float32) - single[:m].astype(mx.float32)).abs()
            rows_off = int((diff.max(axis=1) > 0).sum().item())
            bad.append(f"M={m}: {rows_off} rows differ, max {diff.max().item():.3g}")
    perm = mx.random.permutation(rows, key=mx.random.key(7))
    shuffled = mma(x[perm])
    if not mx.array_equal(shuffled, single[perm]).item():
        bad.append("shuffled rows differ")
    # accuracy against float32 (the dequantized weights for the quantized layers)
    reference_weight = (
        weight.astype(mx.float32)
        if layer is None
        else mx.dequantize(
            layer["weight"],
            layer["scales"].astype(mx.float32),
            layer["biases"].astype(mx.float32),
            group_size=64,
            bits=layer.bits,
        )
    )
    m = 80
    exact = x[:m].astype(mx.float32) @ reference_weight.T
    scale = mx.sqrt(mx.mean(exact * exact)).item()
    errors = {}
    for kernel, product in (("mma", mma), ("row", products["row"]), ("mlx", None)):
        y = product(x[:m]) if product is not None else x[:m] @ weight.T if layer is None else layer(x[:m])
        errors[kernel] = (y.astype(mx.float32) - exact).abs().max().item() / scale
    accuracy = "  ".join(f"{kernel} {error:.2e}" for kernel, error in errors.items())
    verdict = "bit-identical at every M and shuffled" if not bad else "DIFFERS: " + "; ".join(bad)
    print(f"  {name} {verdict:<40} err {accuracy}", flush=True)
    return 1 if bad or errors["mma"] > 4 * max(errors["row"], errors["mlx"], 1e-6) else 0


def siblings() -> int:
    """q/k/v of a 2048-wide layer in one call: each output the bits of its own product."""
    failures = 0
    for dtype in (mx.bfloat16, mx.float16):
        x, weight = dense(2048, 4096, dtype, seed=3)
        widths = [2048, 1024, 1024]
        parts = row_invariant._row_products(x[:33], row_invariant._matmul_kernel, [weight], widths, mma=True)
        start, same = 0, []
        for part, width in zip(parts, widths, strict=True):
            own = row_invariant.row_matmul(x[:33], weight[start : start + width], mma=True)
            same.append(mx.array_equal(part, own).item())
            start += width
        print(f"  siblings q/k/v {widths} {dtype}: each part equals its own product: {same}", flush=True)
        failures += 0 if all(same) else 1
    return failures


def median_us(product: Product, x: mx.array, batch: int, samples: int) -> float:
    """Microseconds per product: `batch` independent products of x's rows per evaluation."""
    inputs = [x + 0 for _ in range(batch)]  # distinct arrays: nothing is shared between the products
    mx.eval(inputs)
    for _ in range(3):
        mx.eval([product(a) for a in inputs])
    mx.synchronize()
    seconds = []
    for _ in range(samples):
        outs = [product(a) for a in inputs]
        mx.synchronize()
        start = time.perf_counter()
        mx.eval(outs)
        mx.synchronize()
        seconds.append((time.perf_counter() - start) / batch)
    return statistics.median(seconds) * 1e6


def timing(shapes: list[tuple[int, int]], args: argparse.Namespace) -> int:
    print(f"\n== timing (bf16): us per product, median of {args.samples} x {args.batch} products", flush=True)
    print("   floor = weight bytes / 4.8 TB/s (H200; an H100 streams 3.35 TB/s)")
    columns = ("row", "mma", "cuBLAS", "mma/row", "mma/cuBLAS", "floor")
    print(f"  {'K x N':<14} {'M':>4} " + " ".join(f"{c:>10}" for c in columns), flush=True)
    for k, n in shapes:
        time_shape(k, n, args)
        mx.clear_cache()
    return 0


def time_shape(k: int, n: int, args: argparse.Namespace) -> None:
    x, weight = dense(k, n, mx.bfloat16, seed=11)
    floor = weight.nbytes / 4.8e12 * 1e6
    products: dict[str, Product] = {
        "row": lambda a: row_invariant.row_matmul(a, weight, mma=False),
        "mma": lambda a: row_invariant.row_matmul(a, weight, mma=True),
        "cuBLAS": lambda a: a @ weight.T,
    }
    for m in TIMING_ROWS:
        us = {name: median_us(product, x[:m], args.batch, args.samples) for name, product in products.items()}
        cells = [us["row"], us["mma"], us["cuBLAS"], us["mma"] / us["row"], us["mma"] / us["cuBLAS"], floor]
        print(f"  {f'{k} x {n}':<14} {m:>4} " + " ".join(f"{c:>10.2f}" for c in cells), flush=True)


def tilings(args: argparse.Namespace) -> int:
    print(
        "\n== MMA block tilings (row tiles x column tiles x column warps; the bits are the same), us per product",
        flush=True,
    )
    print(f"  {'K x N':<14} {'M':>4} " + " ".join(f"{f'{r}x{c}x{w}':>8}" for r, c, w in TILINGS), flush=True)
    failures = 0
    for k, n in ((2048, 6144), (6144, 2048)):
        failures += tile_shape(k, n, args)
        mx.clear_cache()
    return failures


def tile_shape(k: int, n: int, args: argparse.Namespace) -> int:
    x, weight = dense(k, n, mx.bfloat16, seed=13)
    reference = row_invariant.row_matmul(x, weight, mma=True)
    failures = 0
    for m in (1, 16, 32, 80):
        cells = []
        for tiles in TILINGS:

            def product(a: mx.array, tiles: tuple[int, int, int] = tiles) -> mx.array:
                return row_invariant._row_products(
                    a, row_invariant._matmul_kernel, [weight], [n], mma=True, tiles=tiles
                )[0]

            try:
                same = mx.array_equal(product(x[:m]), reference[:m]).item()
                cell = f"{median_us(product, x[:m], args.batch, args.samples):>8.1f}" if same else f"{'DIFF':>8}"
            except Exception as error:  # a tiling that does not compile or launch: say so, time the others
                print(f"  {tiles}: {str(error)[:300]}", flush=True)
                cell, same = f"{'ERR':>8}", False
            failures += 0 if same else 1
            cells.append(cell)
        print(f"  {f'{k} x {n}':<14} {m:>4} " + " ".join(cells), flush=True)
    return failures


if __name__ == "__main__":
    sys.exit(main())
